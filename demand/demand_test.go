package demand

import (
	"errors"
	"fmt"
	"math"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

func TestDemandDecaysAndSums(t *testing.T) {
	m := New(Config{})
	for _, r := range []Report{
		{Author: "a", At: t0, Models: map[string]Sample{"A": {Requests: 4, Refused: 1}}},
		{Author: "b", At: t0.Add(-DefaultHalfLife), Models: map[string]Sample{"A": {Requests: 4}, "B": {Requests: 2, Queued: 2}}},
	} {
		if err := m.Add(t0, r); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name       string
		at         time.Duration
		wantA      float64 // requests of A
		wantBUnmet float64
	}{
		{"now", 0, 4 + 2, 1},
		{"one half-life on", DefaultHalfLife, 2 + 1, 0.5},
		{"past the TTL", DefaultTTL + time.Second, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := New(Config{})
			d.authors = m.authors // the same reports, read at another time
			got := d.Demand(t0.Add(tc.at))
			if math.Abs(got["A"].Requests-tc.wantA) > 1e-9 || math.Abs(got["B"].Unmet()-tc.wantBUnmet) > 1e-9 {
				t.Fatalf("demand %+v: want A requests %v, B unmet %v", got, tc.wantA, tc.wantBUnmet)
			}
		})
	}
}

func TestReportBounds(t *testing.T) {
	many := map[string]Sample{}
	for i := range DefaultMaxModels + 1 {
		many[fmt.Sprint(i)] = Sample{Requests: 1}
	}
	for _, tc := range []struct {
		name string
		r    Report
		want error
	}{
		{"too many models", Report{Author: "x", At: t0, Models: many}, ErrTooLarge},
		{"NaN", Report{Author: "x", At: t0, Models: map[string]Sample{"A": {Requests: math.NaN()}}}, ErrBadValue},
		{"negative", Report{Author: "x", At: t0, Models: map[string]Sample{"A": {Refused: -1}}}, ErrBadValue},
		{"too old", Report{Author: "x", At: t0.Add(-DefaultTTL - time.Second)}, ErrStale},
		{"from the future", Report{Author: "x", At: t0.Add(DefaultMaxSkew + time.Second)}, ErrStale},
		{"fine", Report{Author: "x", At: t0, Models: map[string]Sample{"A": {Requests: 1}}}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := New(Config{}).Add(t0, tc.r); !errors.Is(err, tc.want) || (err == nil) != (tc.want == nil) {
				t.Fatalf("Add = %v, want %v", err, tc.want)
			}
		})
	}
}

// A hostile author floods reports, inflates a model, zeroes another and
// forges thousands of identities: what it adds to a model is bounded,
// honest authors' demand is never lowered, and the map stays bounded.
func TestHostileReportsAreBounded(t *testing.T) {
	m := New(Config{MaxAuthors: 64})
	for i := range 10 {
		if err := m.Add(t0, Report{Author: fmt.Sprint("honest", i), At: t0, Models: map[string]Sample{"A": {Requests: 1, Refused: 0.5}}}); err != nil {
			t.Fatal(err)
		}
	}
	accepted := 0
	for i := range 1000 { // one report a millisecond for a second
		at := t0.Add(time.Duration(i) * time.Millisecond)
		err := m.Add(at, Report{Author: "liar", At: at, Models: map[string]Sample{"A": {}, "B": {Requests: 1e9, Refused: 1e9, TokensPerSec: 1e12}}})
		switch {
		case err == nil:
			accepted++
		case !errors.Is(err, ErrTooSoon):
			t.Fatal(err)
		}
	}
	if accepted != 1 {
		t.Fatalf("%d of a second's reports accepted, want 1 (one per %v)", accepted, DefaultMinInterval)
	}
	d := m.Demand(t0)
	if d["B"].Requests > DefaultMaxRate+1e-9 || d["B"].Refused > DefaultMaxRate+1e-9 {
		t.Fatalf("the liar's model: %+v, over the cap %v", d["B"], DefaultMaxRate)
	}
	if d["A"].Requests < 10-1e-9 || d["A"].Unmet() < 5-1e-9 {
		t.Fatalf("honest demand for A lowered by the liar: %+v", d["A"])
	}
	for i := range 10000 { // sybils
		_ = m.Add(t0.Add(time.Second), Report{Author: fmt.Sprint("sybil", i), At: t0.Add(time.Second), Models: map[string]Sample{"B": {Requests: 1}}})
	}
	if n := m.Authors(); n > 64 {
		t.Fatalf("%d authors kept, at most 64", n)
	}
	if d := m.Demand(t0.Add(time.Second)); d["A"].Requests < 10*math.Exp2(-1.0/60)-1e-9 {
		t.Fatalf("sybils pushed out honest demand for A: %+v", d["A"])
	}
}

// A full map refuses new authors until reports expire; known authors
// still update.
func TestFullMapRefusesNewAuthors(t *testing.T) {
	m := New(Config{MaxAuthors: 2})
	for _, a := range []string{"a", "b"} {
		if err := m.Add(t0, Report{Author: a, At: t0, Models: map[string]Sample{a: {Requests: 1}}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.Add(t0, Report{Author: "c", At: t0}); !errors.Is(err, ErrFull) {
		t.Fatalf("third author: %v, want ErrFull", err)
	}
	at := t0.Add(DefaultMinInterval)
	if err := m.Add(at, Report{Author: "a", At: at, Models: map[string]Sample{"a": {Requests: 3}}}); err != nil {
		t.Fatalf("a known author's update: %v", err)
	}
	late := t0.Add(DefaultTTL + time.Second)
	if err := m.Add(late, Report{Author: "c", At: late}); err != nil {
		t.Fatalf("after b's report expired: %v", err)
	}
}

// Queued and refused requests are requests: an author's unmet demand is
// at most its requests (else a report could make a model look starved
// whatever serves it).
func TestUnmetAtMostRequests(t *testing.T) {
	m := New(Config{})
	if err := m.Add(t0, Report{Author: "liar", At: t0, Models: map[string]Sample{"B": {Requests: 3, Queued: 40, Refused: 40}, "C": {Refused: 9}}}); err != nil {
		t.Fatal(err)
	}
	d := m.Demand(t0)
	if b := d["B"]; b.Requests != 3 || b.Unmet() != 3 || b.Queued != 3 || b.Refused != 0 {
		t.Fatalf("B %+v: unmet capped at the 3 requests", b)
	}
	if c := d["C"]; c.Unmet() != 0 {
		t.Fatalf("C %+v: refusals without requests count for nothing", c)
	}
}
