package frame

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"sort"
	"testing"

	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

func TestF16AllHalvesRoundTrip(t *testing.T) {
	for h := range 1 << 16 {
		f := F16ToF32(uint16(h))
		back := F32ToF16(f)
		if math.IsNaN(float64(f)) {
			if back&0x7c00 != 0x7c00 || back&0x3ff == 0 {
				t.Fatalf("NaN %04x -> %04x, not NaN", h, back)
			}
			continue
		}
		if back != uint16(h) {
			t.Fatalf("%04x -> %g -> %04x", h, f, back)
		}
	}
}

// refF32ToF16 is a slow reference: the nearest finite half by value (ties to
// the even encoding), or Inf beyond the rounding boundary 65520.
func refF32ToF16(f float32) uint16 {
	x := float64(f)
	sign := uint16(0)
	if math.Signbit(x) {
		sign, x = 0x8000, -x
	}
	if math.IsInf(x, 0) || x >= 65520 {
		return sign | 0x7c00
	}
	// Positive finite halves 0x0000..0x7bff are increasing in value.
	i := sort.Search(0x7c00, func(i int) bool { return float64(F16ToF32(uint16(i))) >= x })
	if i == 0x7c00 {
		return sign | 0x7bff
	}
	if i == 0 {
		return sign
	}
	lo, hi := float64(F16ToF32(uint16(i-1))), float64(F16ToF32(uint16(i)))
	switch {
	case hi == x || hi-x < x-lo:
		return sign | uint16(i)
	case x-lo < hi-x:
		return sign | uint16(i-1)
	case i%2 == 0:
		return sign | uint16(i)
	default:
		return sign | uint16(i-1)
	}
}

func TestF32ToF16MatchesReference(t *testing.T) {
	check := func(f float32) {
		t.Helper()
		if got, want := F32ToF16(f), refF32ToF16(f); got != want {
			t.Fatalf("F32ToF16(%g = %08x) = %04x, want %04x", f, math.Float32bits(f), got, want)
		}
	}
	edges := []float32{0, 1, -1, 65504, 65519.99, 65520, -65520, 1e9, 6.1035156e-05, 5.9604645e-08,
		2.9802322e-08, 2.9802326e-08, 1e-10, float32(math.Inf(1)), float32(math.Inf(-1)), 0.1, 1.0009766, 1.00048828125}
	for _, f := range edges {
		check(f)
	}
	// Every half midpoint and its float32 neighbours: the rounding boundaries.
	for h := uint16(0); h < 0x7bff; h++ {
		mid := float32((float64(F16ToF32(h)) + float64(F16ToF32(h+1))) / 2)
		check(mid)
		check(math.Nextafter32(mid, 0))
		check(math.Nextafter32(mid, 1e6))
		check(-mid)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 200000 {
		f := math.Float32frombits(rng.Uint32())
		if !math.IsNaN(float64(f)) {
			check(f)
		}
	}
}

func TestEncodeF16NonFinite(t *testing.T) {
	cases := []struct {
		name string
		in   []float32
		ok   bool
	}{
		{"in range", []float32{0, -1, 65504, -65504, 65519, 1e-9}, true},
		{"outlier", []float32{1, 70000}, false},
		{"rounds to inf", []float32{65520}, false},
		{"inf", []float32{float32(math.Inf(-1))}, false},
		{"nan", []float32{float32(math.NaN())}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			prefix := []byte{9, 9}
			out, err := EncodeF16(prefix, tc.in)
			if tc.ok {
				if err != nil || len(out) != 2+2*len(tc.in) || out[0] != 9 {
					t.Fatalf("got %v, %d bytes", err, len(out))
				}
				back, err := DecodeF16(nil, out[2:])
				if err != nil {
					t.Fatal(err)
				}
				for i, v := range back {
					if d := math.Abs(float64(v - tc.in[i])); d > math.Abs(float64(tc.in[i]))/1024+1e-7 {
						t.Errorf("element %d: %g -> %g", i, tc.in[i], v)
					}
				}
				return
			}
			if !errors.Is(err, ErrNonFinite) || len(out) != 2 {
				t.Fatalf("got %v and %d bytes, want ErrNonFinite and the prefix only", err, len(out))
			}
		})
	}
}

func TestF32Bytes(t *testing.T) {
	f := []float32{1, -2.5}
	b := F32Bytes(f)
	if want := []byte{0, 0, 0x80, 0x3f, 0, 0, 0x20, 0xc0}; !bytes.Equal(b, want) {
		t.Fatalf("F32Bytes = % x, want % x (little-endian)", b, want)
	}
	if !bytes.Equal(AppendF32(nil, f), b) {
		t.Fatal("AppendF32 differs from F32Bytes")
	}
	back, err := AsF32(b)
	if err != nil || len(back) != 2 || back[0] != 1 || back[1] != -2.5 {
		t.Fatalf("AsF32 = %v %v", back, err)
	}
	if len(F32Bytes(nil)) != 0 {
		t.Fatal("F32Bytes(nil) not empty")
	}
	// Misaligned input: still correct (copied).
	buf := make([]byte, 9)
	copy(buf[1:], b)
	mis, err := AsF32(buf[1:])
	if err != nil || mis[0] != 1 || mis[1] != -2.5 {
		t.Fatalf("misaligned AsF32 = %v %v", mis, err)
	}
	if _, err := AsF32(b[:3]); !errors.Is(err, ErrMalformed) {
		t.Fatalf("odd length: %v", err)
	}
	iv := []int32{-1, 7}
	ib := I32Bytes(iv)
	if want := []byte{0xff, 0xff, 0xff, 0xff, 7, 0, 0, 0}; !bytes.Equal(ib, want) {
		t.Fatalf("I32Bytes = % x", ib)
	}
	ib2 := append([]byte{0}, ib...)
	if got, err := AsI32(ib2[1:]); err != nil || got[0] != -1 || got[1] != 7 {
		t.Fatalf("AsI32 = %v %v", got, err)
	}
}

func TestToF32(t *testing.T) {
	src := []float32{0.5, -3, 1024}
	h, err := EncodeF16(nil, src)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		dt meshp2pb.DType
		b  []byte
	}{{meshp2pb.DType_DTYPE_F32, F32Bytes(src)}, {meshp2pb.DType_DTYPE_F16, h}} {
		got, err := ToF32(tc.dt, tc.b, nil)
		if err != nil || len(got) != 3 || got[0] != 0.5 || got[1] != -3 || got[2] != 1024 {
			t.Errorf("ToF32(%s) = %v %v", tc.dt, got, err)
		}
	}
	if _, err := ToF32(meshp2pb.DType_DTYPE_I32, F32Bytes(src), nil); !errors.Is(err, ErrUnsupportedDType) {
		t.Errorf("ToF32(I32): %v", err)
	}
}

// The slice functions inline the scalar fast paths by hand: they must agree
// with the scalar functions bit for bit.
func TestSliceConversionsMatchScalar(t *testing.T) {
	all := make([]byte, 0, 2<<16)
	for h := range 1 << 16 {
		all = append(all, byte(h), byte(h>>8))
	}
	dec, err := DecodeF16(nil, all)
	if err != nil || len(dec) != 1<<16 {
		t.Fatalf("DecodeF16: %v, %d values", err, len(dec))
	}
	var finite []float32
	for h, f := range dec {
		if math.Float32bits(f) != math.Float32bits(F16ToF32(uint16(h))) {
			t.Fatalf("DecodeF16(%04x) = %08x, F16ToF32 = %08x", h, math.Float32bits(f), math.Float32bits(F16ToF32(uint16(h))))
		}
		if !math.IsNaN(float64(f)) && !math.IsInf(float64(f), 0) {
			finite = append(finite, f, math.Nextafter32(f, 0), math.Nextafter32(f, float32(math.Copysign(1e9, float64(f)))))
		}
	}
	for h := uint16(0); h < 0x7bff; h++ { // rounding ties, both signs
		mid := float32((float64(dec[h]) + float64(dec[h+1])) / 2)
		finite = append(finite, mid, -mid)
	}
	var in []float32
	for _, f := range finite {
		if F32ToF16(f)&0x7c00 != 0x7c00 {
			in = append(in, f)
		}
	}
	enc, err := EncodeF16(nil, in)
	if err != nil {
		t.Fatal(err)
	}
	for i, f := range in {
		if got := uint16(enc[2*i]) | uint16(enc[2*i+1])<<8; got != F32ToF16(f) {
			t.Fatalf("EncodeF16(%g) = %04x, F32ToF16 = %04x", f, got, F32ToF16(f))
		}
	}
}
