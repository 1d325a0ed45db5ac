package demand

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

// A claimed model answers Warming (with a retry delay) until it gets a
// route or the timeout passes; then requests give up with a clear state
// for the cooldown, however often the claim is renewed, so a liar cannot
// turn 404s into endless 503s; an honest warm-up is served.
func TestWarmingGivesUp(t *testing.T) {
	w := NewWarm(WarmConfig{})
	if st, _ := w.Ask(t0, "M", false); st != Unknown {
		t.Fatalf("unclaimed: %v, want unknown", st)
	}
	if err := w.Claim(t0, "liar", []string{"M"}); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		at   time.Duration
		want State
	}{
		{0, Warming}, {time.Minute, Warming}, {DefaultWarmTimeout, Warming},
		{DefaultWarmTimeout + time.Second, GaveUp},
		{DefaultWarmTimeout + DefaultWarmCooldown - time.Second, GaveUp},
	}
	for _, s := range steps {
		now := t0.Add(s.at)
		_ = w.Claim(now, "liar", []string{"M"}) // renewed all along
		st, retry := w.Ask(now, "M", false)
		if st != s.want || st == Warming && retry != DefaultRetryAfter {
			t.Fatalf("at %v: %v (retry %v), want %v", s.at, st, retry, s.want)
		}
	}
	late := t0.Add(DefaultWarmTimeout + DefaultWarmCooldown + time.Second)
	_ = w.Claim(late, "liar", []string{"M"})
	if st, _ := w.Ask(late, "M", false); st != Warming {
		t.Fatalf("after the cooldown: %v, want a fresh warming", st)
	}

	honest := NewWarm(WarmConfig{})
	_ = honest.Claim(t0, "standby", []string{"N"})
	if st, _ := honest.Ask(t0, "N", false); st != Warming {
		t.Fatalf("honest: %v", st)
	}
	if st, _ := honest.Ask(t0.Add(2*time.Minute), "N", true); st != Serve {
		t.Fatalf("warmed: %v", st)
	}
}

func TestWarmClaimsBounded(t *testing.T) {
	w := NewWarm(WarmConfig{MaxModels: 4})
	var many []string
	for i := range DefaultMaxClaims + 1 {
		many = append(many, fmt.Sprint(i))
	}
	if err := w.Claim(t0, "x", many); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("too many models in one claim: %v", err)
	}
	for i := range 4 {
		if err := w.Claim(t0, fmt.Sprint("a", i), []string{fmt.Sprint("m", i)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Claim(t0, "b", []string{"m9"}); !errors.Is(err, ErrFull) {
		t.Fatalf("a fifth model: %v, want ErrFull", err)
	}
	if got := len(w.Warmable(t0)); got != 4 {
		t.Fatalf("%d warmable, want 4", got)
	}
	// A new claim replaces the author's old one.
	_ = w.Claim(t0, "a0", []string{"m1"})
	if st, _ := w.Ask(t0, "m0", false); st != Unknown {
		t.Fatalf("a withdrawn claim still warms: %v", st)
	}
	if got := len(w.Warmable(t0.Add(DefaultClaimTTL + time.Second))); got != 0 {
		t.Fatalf("%d warmable after the claims lapsed, want 0", got)
	}
}

// AskOffered takes the caller's word that a model is offered (signed
// adverts) and keeps at most MaxModels asks, forgetting the oldest: fake
// offered models cannot shut a real one out. After Timeout+Cooldown a
// model that gave up may warm again.
func TestAskOfferedBounded(t *testing.T) {
	w := NewWarm(WarmConfig{MaxModels: 3, Timeout: time.Minute, Cooldown: time.Hour})
	now := time.Unix(0, 0)
	for i, m := range []string{"f1", "f2", "f3", "real"} {
		if st, _ := w.AskOffered(now.Add(time.Duration(i)*time.Second), m, false, true); st != Warming {
			t.Fatalf("%s: %v", m, st)
		}
	}
	if len(w.asked) != 3 {
		t.Fatalf("%d asks kept, want 3", len(w.asked))
	}
	if _, ok := w.asked["f1"]; ok {
		t.Fatal("the oldest ask was kept past the bound")
	}
	if st, _ := w.AskOffered(now, "nobody", false, false); st != Unknown {
		t.Fatalf("not offered: %v", st)
	}
	if st, _ := w.AskOffered(now.Add(2*time.Minute), "real", false, true); st != GaveUp {
		t.Fatalf("after the timeout: %v", st)
	}
	if st, _ := w.AskOffered(now.Add(2*time.Hour), "real", false, true); st != Warming {
		t.Fatalf("after the cooldown: %v", st)
	}
}
