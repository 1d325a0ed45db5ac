package frame

import (
	"fmt"
	"strings"

	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// WireDType is one dtype hidden states may travel in between hops. This
// table is the one place that decides the wire dtypes: the CLI flag
// (ParseWireDType), the capability advert (WireDTypeList), hop admission
// (WireDTypeSupported) and the sender (EncodeWire) all read it; ToF32
// decodes each of them.
type WireDType struct {
	Name  string // the --wire-dtype value
	DType meshp2pb.DType
	Exact bool   // bit-identical to running the whole model in one place
	Doc   string // one line for --help and the docs
}

var wireDTypes = []WireDType{
	{Name: "f32", DType: meshp2pb.DType_DTYPE_F32, Exact: true, Doc: "exact"},
	{Name: "f16", DType: meshp2pb.DType_DTYPE_F16, Doc: "half the bytes, close but not identical; a frame with values beyond f16's range goes as f32"},
}

// DefaultWireDType is the wire dtype when none is asked for (exact).
const DefaultWireDType = meshp2pb.DType_DTYPE_F32

// WireDTypes lists the supported wire dtypes, default first.
func WireDTypes() []WireDType { return append([]WireDType(nil), wireDTypes...) }

// WireDTypeList is what a shard advertises it accepts.
func WireDTypeList() []meshp2pb.DType {
	out := make([]meshp2pb.DType, len(wireDTypes))
	for i, w := range wireDTypes {
		out[i] = w.DType
	}
	return out
}

// WireDTypeNames is "f32, f16" (for messages and --help).
func WireDTypeNames() string {
	names := make([]string, len(wireDTypes))
	for i, w := range wireDTypes {
		names[i] = w.Name
	}
	return strings.Join(names, ", ")
}

// WireDTypeSupported reports whether a session may use dt between hops.
func WireDTypeSupported(dt meshp2pb.DType) bool {
	for _, w := range wireDTypes {
		if w.DType == dt {
			return true
		}
	}
	return false
}

// ParseWireDType maps a --wire-dtype name to its dtype.
func ParseWireDType(name string) (meshp2pb.DType, error) {
	for _, w := range wireDTypes {
		if w.Name == name {
			return w.DType, nil
		}
	}
	return 0, fmt.Errorf("%w: wire dtype %q: want one of %s", ErrUnsupportedDType, name, WireDTypeNames())
}

// EncodeWire is the sender's side of the table: hidden states as payload
// bytes in dt, and the dtype actually sent. An f16 frame whose values do
// not fit f16 goes as f32 (exactly) instead. F32 is a view of hidden, not a
// copy.
func EncodeWire(dt meshp2pb.DType, hidden []float32) ([]byte, meshp2pb.DType) {
	if dt == meshp2pb.DType_DTYPE_F16 {
		if b, err := EncodeF16(nil, hidden); err == nil {
			return b, dt
		}
	}
	return F32Bytes(hidden), meshp2pb.DType_DTYPE_F32
}
