package frame

import (
	"fmt"
	"hash/crc32"
	"math"

	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Checksum returns the CRC-32C (Castagnoli) of b, as in TensorInfo.crc32c.
func Checksum(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// DTypeSize returns the size in bytes of one element, or 0 for an unknown dtype.
func DTypeSize(dt meshp2pb.DType) int {
	switch dt {
	case meshp2pb.DType_DTYPE_F32, meshp2pb.DType_DTYPE_I32:
		return 4
	case meshp2pb.DType_DTYPE_F16:
		return 2
	}
	return 0
}

// TensorByteLength returns the byte length of a tensor of the given dtype and
// shape, checking every dim >= 0, len(shape) <= lim.MaxRank and the result <=
// lim.MaxPayload (so the multiplication never overflows).
func TensorByteLength(dt meshp2pb.DType, shape []int64, lim Limits) (int, error) {
	lim = lim.norm()
	size := DTypeSize(dt)
	if size == 0 {
		return 0, fmt.Errorf("%w: %d", ErrUnsupportedDType, int32(dt))
	}
	if len(shape) == 0 {
		return 0, fmt.Errorf("%w: tensor without shape", ErrMalformed)
	}
	if len(shape) > lim.MaxRank {
		return 0, fmt.Errorf("%w: rank %d > %d", ErrFrameTooLarge, len(shape), lim.MaxRank)
	}
	zero := false
	for _, d := range shape {
		if d < 0 {
			return 0, fmt.Errorf("%w: negative dim in shape %v", ErrMalformed, shape)
		}
		zero = zero || d == 0
	}
	if zero {
		return 0, nil
	}
	n := int64(size)
	for _, d := range shape {
		if n > int64(lim.MaxPayload)/d { // n*d > MaxPayload, without overflowing
			return 0, fmt.Errorf("%w: shape %v over %d bytes", ErrFrameTooLarge, shape, lim.MaxPayload)
		}
		n *= d
	}
	return int(n), nil
}

// ValidateActivation checks an activation header against the bundle rules
// and lim, and returns the payload length it declares. Rules: 16-byte
// session id; 1 <= n_rows <= MaxRows; pos_start + n_rows fits an int32
// position; tokens empty or exactly n_rows; at least one tensor or token;
// <= MaxTensors tensors with unique non-empty names (<= MaxNameLen bytes),
// known dtypes, 1..MaxRank dims, shape[0] == n_rows, and byte_length ==
// product(shape) x dtype size; total <= MaxPayload.
func ValidateActivation(hdr *meshp2pb.ActivationHeader, lim Limits) (int, error) {
	lim = lim.norm()
	if len(hdr.GetSessionId()) != SessionIDLen {
		return 0, fmt.Errorf("%w: session id of %d bytes", ErrMalformed, len(hdr.GetSessionId()))
	}
	rows := int64(hdr.GetNRows())
	if rows == 0 {
		return 0, fmt.Errorf("%w: n_rows is 0", ErrMalformed)
	}
	if rows > int64(lim.MaxRows) {
		return 0, fmt.Errorf("%w: n_rows %d > %d", ErrFrameTooLarge, rows, lim.MaxRows)
	}
	if int64(hdr.GetPosStart())+rows > math.MaxInt32 {
		return 0, fmt.Errorf("%w: positions [%d, +%d) overflow int32", ErrMalformed, hdr.GetPosStart(), rows)
	}
	if nt := len(hdr.GetTokens()); nt != 0 && int64(nt) != rows {
		return 0, fmt.Errorf("%w: %d tokens for %d rows", ErrMalformed, nt, rows)
	}
	ts := hdr.GetTensors()
	if len(ts) == 0 && len(hdr.GetTokens()) == 0 {
		return 0, fmt.Errorf("%w: empty bundle (no tensors, no tokens)", ErrMalformed)
	}
	if len(ts) > lim.MaxTensors {
		return 0, fmt.Errorf("%w: %d tensors > %d", ErrFrameTooLarge, len(ts), lim.MaxTensors)
	}
	total := 0
	for i, t := range ts {
		name := t.GetName()
		if name == "" {
			return 0, fmt.Errorf("%w: tensor %d has no name", ErrMalformed, i)
		}
		if len(name) > lim.MaxNameLen {
			return 0, fmt.Errorf("%w: tensor name of %d bytes > %d", ErrFrameTooLarge, len(name), lim.MaxNameLen)
		}
		for _, u := range ts[:i] {
			if u.GetName() == name {
				return 0, fmt.Errorf("%w: duplicate tensor name %q", ErrMalformed, name)
			}
		}
		n, err := TensorByteLength(t.GetDtype(), t.GetShape(), lim)
		if err != nil {
			return 0, fmt.Errorf("tensor %q: %w", name, err)
		}
		if t.GetShape()[0] != rows {
			return 0, fmt.Errorf("%w: tensor %q shape %v, leading dim must be n_rows %d", ErrMalformed, name, t.GetShape(), rows)
		}
		if t.GetByteLength() != uint64(n) {
			return 0, fmt.Errorf("%w: tensor %q byte_length %d, shape %v %s needs %d", ErrMalformed, name, t.GetByteLength(), t.GetShape(), t.GetDtype(), n)
		}
		if total += n; total > lim.MaxPayload {
			return 0, fmt.Errorf("%w: tensors total %d bytes > %d", ErrFrameTooLarge, total, lim.MaxPayload)
		}
	}
	return total, nil
}

// prepareActivation fills byte lengths and checksums from tensors and
// validates the result; it returns the payload length.
func prepareActivation(hdr *meshp2pb.ActivationHeader, tensors [][]byte, lim Limits) (int, error) {
	if len(tensors) != len(hdr.GetTensors()) {
		return 0, fmt.Errorf("%w: %d tensor infos, %d tensors", ErrMalformed, len(hdr.GetTensors()), len(tensors))
	}
	for i, t := range hdr.Tensors {
		t.ByteLength = uint64(len(tensors[i]))
		t.Crc32C = Checksum(tensors[i])
	}
	return ValidateActivation(hdr, lim)
}
