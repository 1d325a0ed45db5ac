package frame

import (
	"errors"
	"math"
	"testing"

	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

func TestWireDTypeTable(t *testing.T) {
	for _, tc := range []struct {
		name    string
		want    meshp2pb.DType
		wantErr bool
	}{
		{"f32", meshp2pb.DType_DTYPE_F32, false},
		{"f16", meshp2pb.DType_DTYPE_F16, false},
		{"i32", 0, true},
		{"", 0, true},
	} {
		got, err := ParseWireDType(tc.name)
		if (err != nil) != tc.wantErr || (err == nil && got != tc.want) || (err != nil && !errors.Is(err, ErrUnsupportedDType)) {
			t.Errorf("ParseWireDType(%q) = %v, %v", tc.name, got, err)
		}
	}
	if WireDTypes()[0].DType != DefaultWireDType || !WireDTypes()[0].Exact {
		t.Error("the default wire dtype must come first and be exact")
	}
	for _, dt := range WireDTypeList() {
		if !WireDTypeSupported(dt) {
			t.Errorf("advertised %s is not admitted", dt)
		}
		if _, err := ToF32(dt, make([]byte, 8), nil); err != nil {
			t.Errorf("advertised %s cannot be decoded: %v", dt, err)
		}
	}
	if WireDTypeSupported(meshp2pb.DType_DTYPE_I32) {
		t.Error("i32 is not a wire dtype for hidden states")
	}
}

func TestEncodeWire(t *testing.T) {
	for _, tc := range []struct {
		name   string
		dt     meshp2pb.DType
		in     []float32
		sentAs meshp2pb.DType
	}{
		{"f32", meshp2pb.DType_DTYPE_F32, []float32{1, -2.5, 3e30}, meshp2pb.DType_DTYPE_F32},
		{"f16 in range", meshp2pb.DType_DTYPE_F16, []float32{1, -2.5, 0.125}, meshp2pb.DType_DTYPE_F16},
		{"f16 overflow goes as f32", meshp2pb.DType_DTYPE_F16, []float32{1, 1e6}, meshp2pb.DType_DTYPE_F32},
	} {
		b, dt := EncodeWire(tc.dt, tc.in)
		if dt != tc.sentAs {
			t.Errorf("%s: sent as %s, want %s", tc.name, dt, tc.sentAs)
			continue
		}
		back, err := ToF32(dt, b, nil)
		if err != nil || len(back) != len(tc.in) {
			t.Fatalf("%s: %v", tc.name, err)
		}
		for i := range back {
			if math.Abs(float64(back[i]-tc.in[i])) > 1e-3*math.Abs(float64(tc.in[i])) {
				t.Errorf("%s: value %d: %v, want %v", tc.name, i, back[i], tc.in[i])
			}
		}
	}
}
