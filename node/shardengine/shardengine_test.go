package shardengine

import (
	"errors"
	"fmt"
	"testing"

	"github.com/neuron-tai/meshp2p/engine"
	"github.com/neuron-tai/meshp2p/session"
)

func TestErrorMarks(t *testing.T) {
	other := errors.New("llama_decode failed")
	for _, tc := range []struct {
		name string
		in   error
		want error // the session error it must match (nil: none)
	}{
		{"no capacity", fmt.Errorf("open: %w", engine.ErrNoCapacity), session.ErrNoCapacity},
		{"bad input", fmt.Errorf("forward: %w", engine.ErrBadInput), session.ErrBadInput},
		{"other", other, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Error(tc.in)
			if got.Error() != tc.in.Error() {
				t.Errorf("message %q, want the engine's %q", got, tc.in)
			}
			if !errors.Is(got, tc.in) {
				t.Errorf("%v does not keep the engine's error", got)
			}
			for _, mark := range []error{session.ErrNoCapacity, session.ErrBadInput} {
				if is := errors.Is(got, mark); is != (mark == tc.want) {
					t.Errorf("errors.Is(%v, %v) = %v", got, mark, is)
				}
			}
		})
	}
}
