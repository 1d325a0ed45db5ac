package demand

import (
	"fmt"
	"testing"
	"time"
)

// The meter turns counts into per-second rates over its window, starts a
// new window at each Take, and keeps at most DefaultMaxModels models (the
// most requested).
func TestMeterTake(t *testing.T) {
	t0 := time.Unix(1000, 0)
	m := NewMeter(t0)
	if _, ok := m.Take(t0.Add(time.Second), "me"); ok {
		t.Fatal("a report from an empty window")
	}
	for range 20 {
		m.Request("a")
	}
	m.Queued("a")
	m.Refused("a")
	m.Refused("a")
	m.Tokens("a", 100)
	m.Request("b")
	m.Request("") // no model: not counted
	var nilMeter *Meter
	nilMeter.Request("a") // a client without a meter counts nothing
	r, ok := m.Take(t0.Add(11*time.Second), "me")
	if !ok || r.Author != "me" || len(r.Models) != 2 {
		t.Fatalf("report %+v", r)
	}
	if a := r.Models["a"]; a != (Sample{Requests: 2, Queued: 0.1, Refused: 0.2, TokensPerSec: 10}) {
		t.Fatalf("a: %+v", a)
	}
	if _, ok := m.Take(t0.Add(21*time.Second), "me"); ok {
		t.Fatal("the next window repeated the last")
	}
	for i := range 3 * DefaultMaxModels {
		for range i + 1 {
			m.Request(fmt.Sprint("m", i))
		}
	}
	r, _ = m.Take(t0.Add(31*time.Second), "me")
	if len(r.Models) != DefaultMaxModels {
		t.Fatalf("%d models in a report, want at most %d", len(r.Models), DefaultMaxModels)
	}
	if _, ok := r.Models[fmt.Sprint("m", 3*DefaultMaxModels-1)]; !ok {
		t.Fatal("the most requested model was left out")
	}
	if err := New(Config{}).Add(t0.Add(31*time.Second), r); err != nil {
		t.Fatalf("a meter's report refused by the map: %v", err)
	}
}
