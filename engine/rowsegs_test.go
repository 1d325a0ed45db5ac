package engine

import (
	"slices"
	"testing"
)

// rowSegs hold the same floats as one slice would, through adds, cuts
// into shared and own segments, and a hand-over; the shared segments are
// never written.
func TestRowSegs(t *testing.T) {
	shared := []float32{1, 2, 3, 4, 5, 6}
	orig := slices.Clone(shared)
	for _, tc := range []struct {
		name string
		ops  func(r *rowSegs)
		want []float32
	}{
		{"adopted", func(r *rowSegs) {}, []float32{1, 2, 3, 4, 5, 6}},
		{"added", func(r *rowSegs) { r.add([]float32{7, 8}) }, []float32{1, 2, 3, 4, 5, 6, 7, 8}},
		{"cut into own", func(r *rowSegs) { r.add([]float32{7, 8}); r.cut(7) }, []float32{1, 2, 3, 4, 5, 6, 7}},
		{"cut into shared, added", func(r *rowSegs) { r.add([]float32{7, 8}); r.cut(4); r.add([]float32{9}) }, []float32{1, 2, 3, 4, 9}},
		{"cut to nothing", func(r *rowSegs) { r.cut(0); r.add([]float32{9}) }, []float32{9}},
		{"cut in the second segment", func(r *rowSegs) { r.segs = append(r.segs, []float32{10, 11}); r.cut(7) }, []float32{1, 2, 3, 4, 5, 6, 10}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := rowSegs{segs: cutSegs([][]float32{shared}, 6)}
			tc.ops(&r)
			if got := flat(r.frozen()); !slices.Equal(got, tc.want) || r.n() != len(tc.want) {
				t.Fatalf("rows %v (n %d), want %v", got, r.n(), tc.want)
			}
			for n := range len(tc.want) + 1 {
				if got := flat(cutSegs(r.frozen(), n)); !slices.Equal(got, tc.want[:n]) {
					t.Fatalf("first %d: %v, want %v", n, got, tc.want[:n])
				}
			}
			if !slices.Equal(shared, orig) {
				t.Fatalf("the shared segment was written: %v", shared)
			}
		})
	}
}
