package frame

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// testScope is a memory scope with a limit, like a libp2p stream scope.
type testScope struct {
	limit, used, reserves int
}

func (s *testScope) ReserveMemory(n int, _ uint8) error {
	if s.used+n > s.limit {
		return fmt.Errorf("cannot reserve %d: %d of %d used", n, s.used, s.limit)
	}
	s.used += n
	s.reserves++
	return nil
}

func (s *testScope) ReleaseMemory(n int) { s.used -= n }

// TestReaderChargesScope: a charged Reader reserves each payload buffer
// before it reads a payload byte, its buffer never outgrows the
// reservation, a reused buffer reserves only what it grows by, a buffer
// far larger than the next frame is given back, and a
// refused reservation is ErrFrameTooLarge with the payload left unread.
func TestReaderChargesScope(t *testing.T) {
	small, smallT := testBundle(2, 16, true) // f16 residual + f32: padding between tensors
	big, bigT := testBundle(64, 512, false)  // 128 KiB: grown in steps
	stream := append(encodeActivation(t, small, smallT...), encodeActivation(t, big, bigT...)...)
	stream = append(stream, encodeActivation(t, small, smallT...)...)

	sc := &testScope{limit: 1 << 20}
	r := NewReader(bytes.NewReader(stream), Limits{}).ChargeTo(sc)
	for i, wantHdr := range []int{2, 64, 2} {
		hdr, _, err := r.ReadActivation()
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if int(hdr.NRows) != wantHdr {
			t.Fatalf("frame %d: %d rows", i, hdr.NRows)
		}
		if cap(r.payload) > sc.used || sc.used != r.charged {
			t.Fatalf("frame %d: buffer cap %d, scope holds %d, reader charged %d", i, cap(r.payload), sc.used, r.charged)
		}
		if i == 1 && sc.used != 64*512*4 {
			t.Fatalf("the big frame: scope holds %d bytes, want %d", sc.used, 64*512*4)
		}
	}
	// The small frame, the big one's growth, then the small one again
	// after the big buffer was given back.
	if want := 12 + 4 + 2*16*4; sc.used != want || sc.reserves != 3 {
		t.Fatalf("scope holds %d bytes after %d reservations, want %d after 3", sc.used, sc.reserves, want)
	}

	// A scope without room: the frame is refused from its header.
	in := bytes.NewReader(encodeActivation(t, big, bigT...))
	tight := &testScope{limit: 64 << 10}
	_, _, err := NewReader(in, Limits{}).ChargeTo(tight).ReadActivation()
	if !errors.Is(err, ErrFrameTooLarge) || !strings.Contains(err.Error(), "memory limit") {
		t.Fatalf("want ErrFrameTooLarge (memory limit), got %v", err)
	}
	if in.Len() != 64*512*4 || tight.used != 0 {
		t.Fatalf("%d payload bytes left unread of %d, scope holds %d: want the payload unread and nothing held", in.Len(), 64*512*4, tight.used)
	}
}
