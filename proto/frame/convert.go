package frame

import (
	"encoding/binary"
	"fmt"
	"math"
	"unsafe"

	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// littleEndian reports whether the machine stores the wire byte order
// natively; only then do the conversions below return views instead of copies.
var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// F32Bytes returns f as little-endian bytes. On little-endian machines the
// result aliases f (no copy); elsewhere it is a copy.
func F32Bytes(f []float32) []byte {
	if littleEndian {
		return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(f))), len(f)*4)
	}
	return AppendF32(make([]byte, 0, len(f)*4), f)
}

// I32Bytes returns v as little-endian bytes, aliasing v on little-endian machines.
func I32Bytes(v []int32) []byte {
	if littleEndian {
		return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(v))), len(v)*4)
	}
	out := make([]byte, 0, len(v)*4)
	for _, x := range v {
		out = binary.LittleEndian.AppendUint32(out, uint32(x))
	}
	return out
}

// AppendF32 appends src to dst as little-endian bytes (always a copy).
func AppendF32(dst []byte, src []float32) []byte {
	for _, x := range src {
		dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(x))
	}
	return dst
}

func aligned4(b []byte) bool {
	return uintptr(unsafe.Pointer(unsafe.SliceData(b)))%4 == 0
}

// AsF32 interprets little-endian bytes as float32s. On little-endian
// machines with 4-byte aligned b (tensors from a Reader always are) the
// result aliases b; otherwise it is a copy. len(b) must be a multiple of 4.
func AsF32(b []byte) ([]float32, error) {
	if len(b)%4 != 0 {
		return nil, fmt.Errorf("%w: %d bytes is not a whole number of f32", ErrMalformed, len(b))
	}
	if littleEndian && aligned4(b) {
		return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/4), nil
	}
	return DecodeF32(make([]float32, 0, len(b)/4), b)
}

// AsI32 is AsF32 for int32.
func AsI32(b []byte) ([]int32, error) {
	if len(b)%4 != 0 {
		return nil, fmt.Errorf("%w: %d bytes is not a whole number of i32", ErrMalformed, len(b))
	}
	if littleEndian && aligned4(b) {
		return unsafe.Slice((*int32)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/4), nil
	}
	out := make([]int32, 0, len(b)/4)
	for i := 0; i < len(b); i += 4 {
		out = append(out, int32(binary.LittleEndian.Uint32(b[i:])))
	}
	return out, nil
}

// DecodeF32 appends the float32s in little-endian b to dst (always a copy).
func DecodeF32(dst []float32, b []byte) ([]float32, error) {
	if len(b)%4 != 0 {
		return dst, fmt.Errorf("%w: %d bytes is not a whole number of f32", ErrMalformed, len(b))
	}
	for i := 0; i < len(b); i += 4 {
		dst = append(dst, math.Float32frombits(binary.LittleEndian.Uint32(b[i:])))
	}
	return dst, nil
}

// EncodeF16 appends src to dst as little-endian IEEE binary16, rounding to
// nearest even. If any value is not finite after conversion (NaN, ±Inf, or
// |x| rounding above 65504, as hidden-state outliers do) it returns dst
// unchanged and an error wrapping ErrNonFinite: send f32 instead.
func EncodeF16(dst []byte, src []float32) ([]byte, error) {
	n0 := len(dst)
	dst = growLen(dst, len(src)*2)
	out := dst[n0:]
	for i, x := range src {
		// F32ToF16's normal-range path, inlined by hand (the compiler will not).
		var h uint16
		if b := math.Float32bits(x); (b>>23)&0xff-113 < 30 {
			v := ((b>>23)&0xff-112)<<10 | (b>>13)&0x3ff
			v += (b&0x1fff + 0xfff + v&1) >> 13
			h = uint16(b>>16)&0x8000 | uint16(v)
		} else {
			h = f32ToF16Slow(b)
		}
		if h&0x7c00 == 0x7c00 {
			return dst[:n0], fmt.Errorf("%w: element %d is %g", ErrNonFinite, i, x)
		}
		binary.LittleEndian.PutUint16(out[2*i:], h)
	}
	return dst, nil
}

// DecodeF16 appends the binary16 values in little-endian b to dst as float32
// (exact: every f16 is representable).
func DecodeF16(dst []float32, b []byte) ([]float32, error) {
	if len(b)%2 != 0 {
		return dst, fmt.Errorf("%w: %d bytes is not a whole number of f16", ErrMalformed, len(b))
	}
	n0 := len(dst)
	dst = growLen(dst, len(b)/2)
	out := dst[n0:]
	for i := range out {
		h := uint32(binary.LittleEndian.Uint16(b[2*i:]))
		if e := h >> 10 & 0x1f; e-1 < 30 { // normal: F16ToF32's fast path, inlined by hand
			out[i] = math.Float32frombits((h&0x8000)<<16 | (e+112)<<23 | (h&0x3ff)<<13)
		} else {
			out[i] = F16ToF32(uint16(h))
		}
	}
	return dst, nil
}

// ToF32 returns the f32 values of a tensor of dtype dt: a view of b for F32
// where AsF32 allows it, else decoded into dst[:0] (reused when large enough).
func ToF32(dt meshp2pb.DType, b []byte, dst []float32) ([]float32, error) {
	switch dt {
	case meshp2pb.DType_DTYPE_F32:
		return AsF32(b)
	case meshp2pb.DType_DTYPE_F16:
		return DecodeF16(dst[:0], b)
	}
	return nil, fmt.Errorf("%w: %s is not a float dtype", ErrUnsupportedDType, dt)
}

// growLen extends s by n elements, reallocating at most once.
func growLen[E any](s []E, n int) []E {
	if cap(s)-len(s) < n {
		t := make([]E, len(s), len(s)+n)
		copy(t, s)
		s = t
	}
	return s[:len(s)+n]
}

// F32ToF16 converts to IEEE binary16 bits, rounding to nearest even;
// overflow gives ±Inf, NaN stays NaN (quiet). Small enough to inline: the
// normal range is handled here, the rest in f32ToF16Slow.
func F32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	e := (b >> 23) & 0xff
	if e-113 < 30 { // half exponent 1..30: a normal half
		v := (e-112)<<10 | (b>>13)&0x3ff
		// Round to nearest even: carry when the dropped 13 bits exceed half,
		// or equal half and v is odd. A carry into the exponent (up to Inf)
		// is the right encoding.
		v += (b&0x1fff + 0xfff + v&1) >> 13
		return uint16(b>>16)&0x8000 | uint16(v)
	}
	return f32ToF16Slow(b)
}

func f32ToF16Slow(b uint32) uint16 {
	sign := uint16(b>>16) & 0x8000
	exp := int32(b>>23) & 0xff
	mant := b & 0x7fffff
	if exp == 0xff {
		if mant != 0 {
			return sign | 0x7e00 | uint16(mant>>13) // quiet NaN, keep the top payload bits
		}
		return sign | 0x7c00
	}
	e := exp - 127 + 15
	if e >= 0x1f {
		return sign | 0x7c00
	}
	// Subnormal half (or zero): value = (mant|implicit) * 2^(exp-150), unit 2^-24.
	if e < -10 {
		return sign
	}
	m := mant | 0x800000
	shift := uint32(14 - e) // 14..24
	v := m >> shift
	rem := m & (1<<shift - 1)
	half := uint32(1) << (shift - 1)
	if rem > half || (rem == half && v&1 == 1) {
		v++ // may carry into the smallest normal: still the right encoding
	}
	return sign | uint16(v)
}

// F16ToF32 converts IEEE binary16 bits to float32 (exact).
func F16ToF32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	case exp != 0:
		return math.Float32frombits(sign | (exp+112)<<23 | mant<<13)
	case mant == 0:
		return math.Float32frombits(sign)
	}
	// Subnormal: normalise.
	e := uint32(113)
	for mant&0x400 == 0 {
		mant <<= 1
		e--
	}
	return math.Float32frombits(sign | e<<23 | (mant&0x3ff)<<13)
}
