package session

import (
	"testing"
	"time"
)

// The timeouts must stay ordered so that the most specific report wins:
// a seam writer gives up before its hop's idle timer, which fires before
// the origin's token timeout.
func TestTimeoutLadder(t *testing.T) {
	if err := CheckTimeoutLadder(DefaultIdle, DefaultTokenTimeout); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	for _, tc := range []struct {
		name        string
		idle, token time.Duration
		ok          bool
	}{
		{"defaults", DefaultIdle, DefaultTokenTimeout, true},
		{"idle equals token timeout", DefaultTokenTimeout, DefaultTokenTimeout, false},
		{"idle above token timeout", 2 * DefaultTokenTimeout, DefaultTokenTimeout, false},
		{"write deadline below the fail report", 2 * FailWriteTimeout, DefaultTokenTimeout, false},
	} {
		if err := CheckTimeoutLadder(tc.idle, tc.token); (err == nil) != tc.ok {
			t.Errorf("%s: CheckTimeoutLadder(%s, %s) = %v", tc.name, tc.idle, tc.token, err)
		}
	}
	if admissionBudget(DefaultOpenTimeout, 2, 3) >= admissionBudget(DefaultOpenTimeout, 1, 3) ||
		admissionBudget(DefaultOpenTimeout, 1, 3) >= admissionBudget(DefaultOpenTimeout, 0, 3) ||
		admissionBudget(DefaultOpenTimeout, 2, 3) <= 0 {
		t.Error("admission budgets must shrink along the route and stay positive")
	}
}
