package session

import (
	"strings"
	"testing"

	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// The cross-class rule: honest rounding passes even where many values
// below the largest are close (their ranks shuffle); a skipped layer's
// kind of change, a shrunk value, or a value that clearly beats the
// signed ones fails.
func TestToleranceCompare(t *testing.T) {
	base := func() []float32 {
		row := make([]float32, 4096)
		row[7] = 1000
		for i := range 20 { // twenty values between 10 and 11.9
			row[100+i] = 10 + 0.1*float32(i)
		}
		return row
	}
	signed := SketchRow(base(), SketchK)
	for _, tc := range []struct {
		name  string
		tweak func(row []float32)
		fails string // "" passes
	}{
		{"identical", func([]float32) {}, ""},
		{"close values reordered (rounding)", func(row []float32) {
			for i := range 20 {
				row[100+i] = 11.9 - 0.1*float32(i)
			}
		}, ""},
		{"largest off by 1%", func(row []float32) { row[7] = 1010 }, ""},
		{"largest off by 10%", func(row []float32) { row[7] = 1100 }, "over the tolerance"},
		{"the largest value shrunk", func(row []float32) { row[7] = 900 }, "over the tolerance"},
		{"an unsigned value clearly beats the signed", func(row []float32) { row[3000] = 500 }, "clearly beats"},
	} {
		row := base()
		tc.tweak(row)
		got := SketchTolerance.Compare([]*meshp2pb.SketchRow{signed}, [][]float32{row})
		if (got == "") != (tc.fails == "") || !strings.Contains(got, tc.fails) {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.fails)
		}
	}
	if got := SketchTolerance.Compare([]*meshp2pb.SketchRow{{}}, [][]float32{base()}); got == "" {
		t.Error("an empty signed sketch of a full row passed")
	}
}
