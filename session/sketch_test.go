package session

import (
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"
)

// SketchRow keeps the k largest magnitudes, ties to the lower index, NaN
// as the largest: the same as a stable sort by decreasing magnitude.
func TestSketchRowMatchesSort(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for n := range 200 {
		row := make([]float32, n%40)
		for i := range row {
			row[i] = float32(rng.IntN(7) - 3) // many ties
			if rng.IntN(20) == 0 {
				row[i] = float32(math.NaN())
			}
		}
		for _, k := range []int{0, 1, 3, 8} {
			got := SketchRow(row, k)
			ids := make([]int, len(row))
			for i := range ids {
				ids[i] = i
			}
			mag := func(i int) float64 {
				v := math.Abs(float64(row[i]))
				if math.IsNaN(v) {
					return math.Inf(1)
				}
				return v
			}
			sort.SliceStable(ids, func(a, b int) bool { return mag(ids[a]) > mag(ids[b]) })
			want := []uint32{}
			for _, i := range ids[:min(k, len(ids))] {
				want = append(want, uint32(i))
			}
			if !slices.Equal(got.GetIndex(), want) {
				t.Fatalf("row %v k %d: %v, want %v", row, k, got.GetIndex(), want)
			}
		}
	}
}
