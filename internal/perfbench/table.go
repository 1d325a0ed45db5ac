package perfbench

import (
	"fmt"
	"io"
	"slices"
	"time"
)

// Row is one line of the bench table: a figure, the baseline it is
// compared with (measured in the same run) and their ratio.
type Row struct {
	Name     string
	Value    float64
	Unit     string
	Baseline float64 // 0: none
	BaseName string
	Goal     string
}

// Table collects rows and prints them aligned.
type Table struct{ Rows []Row }

// Add appends a row.
func (t *Table) Add(r Row) { t.Rows = append(t.Rows, r) }

// Print writes the table.
func (t *Table) Print(w io.Writer) {
	fmt.Fprintf(w, "%-44s %12s %-10s %12s %-34s %8s  %s\n", "figure", "value", "unit", "baseline", "baseline is", "ratio", "goal")
	for _, r := range t.Rows {
		base, ratio := "", ""
		if r.Baseline != 0 {
			base = fmt.Sprintf("%.3f", r.Baseline)
			ratio = fmt.Sprintf("%.3f", r.Value/r.Baseline)
		}
		fmt.Fprintf(w, "%-44s %12.3f %-10s %12s %-34s %8s  %s\n", r.Name, r.Value, r.Unit, base, r.BaseName, ratio, r.Goal)
	}
}

// Median of ds in ms.
func medianMs(ds []time.Duration) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	m := s[len(s)/2]
	if len(s)%2 == 0 {
		m = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return float64(m) / float64(time.Millisecond)
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 0 {
		return (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return s[len(s)/2]
}
