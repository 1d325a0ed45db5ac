package session

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// servedEngine is one layer range a hop serves. A hop serves one range
// normally and two while it moves (docs/placement.md): the new range is
// added and admits at once, the old one stops admitting and drains.
type servedEngine struct {
	eng       Engine
	info      ShardInfo
	admitting bool // guarded by HopService.mu
}

// AddEngine adds a layer range of the same model to the hop; it admits
// sessions at once. An engine for a range already served is refused.
func (h *HopService) AddEngine(eng Engine) error {
	info := eng.Info()
	h.mu.Lock()
	defer h.mu.Unlock()
	if info.ParentNLayer != h.info.ParentNLayer || info.NEmbd != h.info.NEmbd {
		return fmt.Errorf("session: engine %d-%d is not of this hop's model (%d layers, n_embd %d)", info.Start, info.End, h.info.ParentNLayer, h.info.NEmbd)
	}
	for _, se := range h.engines {
		if se.info.Start == info.Start && se.info.End == info.End {
			return fmt.Errorf("session: layers %d-%d are already served", info.Start, info.End)
		}
	}
	h.engines = append(h.engines, &servedEngine{eng: eng, info: info, admitting: true})
	return nil
}

// model is the model the hop serves: its fingerprint and geometry.
func (h *HopService) model() (string, ShardInfo) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.fp, h.info
}

// Fingerprint is the fingerprint of the model the hop serves now.
func (h *HopService) Fingerprint() string {
	fp, _ := h.model()
	return fp
}

// ErrHopBusy: Retarget was called while the hop still serves a range.
var ErrHopBusy = errors.New("session: the hop still serves layers")

// Retarget makes the hop serve another model, whose first range is eng
// (a node that moves to another model, docs/placement.md "Many models").
// Every range of the old model must have been drained first (Drain), so
// no session runs on it; otherwise it returns ErrHopBusy. Sessions of the
// old model are refused from then on (MODEL_MISMATCH).
func (h *HopService) Retarget(fingerprint string, eng Engine) error {
	info := eng.Info()
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.engines) > 0 {
		return fmt.Errorf("%w: %d range(s) of model %.16s", ErrHopBusy, len(h.engines), h.fp)
	}
	h.fp, h.info = fingerprint, info
	h.engines = []*servedEngine{{eng: eng, info: info, admitting: true}}
	h.moved = nil
	h.speed.mu.Lock()
	h.speed.layers = max(1, info.End-info.Start)
	h.speed.n = 0
	h.speed.mu.Unlock()
	return nil
}

// StopAdmitting makes the hop refuse new sessions for layers [start, end)
// (NO_CAPACITY, which origins retry on another route without holding it
// against this peer); open sessions go on.
func (h *HopService) StopAdmitting(start, end int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, se := range h.engines {
		if se.info.Start == start && se.info.End == end {
			se.admitting = false
		}
	}
}

// Drain waits until no session runs on layers [start, end), then removes
// that engine from the hop; the caller may then close it. When ctx ends
// first, the sessions still open are ended with SHUTTING_DOWN (their
// origins re-route) and waited for. It returns how many were ended so.
func (h *HopService) Drain(ctx context.Context, start, end int) int {
	h.StopAdmitting(start, end)
	ended := 0
	for {
		left := h.sessionsOn(start, end)
		if len(left) == 0 {
			break
		}
		if ctx.Err() != nil {
			for _, hs := range left {
				hs.fail(codeErr(meshp2pb.ErrorCode_ERROR_CODE_SHUTTING_DOWN, fmt.Sprintf("hop moved away from layers %d-%d", start, end), h.host.ID()))
			}
			for _, hs := range left {
				<-hs.released
			}
			ended = len(left)
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, se := range h.engines {
		if se.info.Start == start && se.info.End == end {
			h.engines = append(h.engines[:i], h.engines[i+1:]...)
			break
		}
	}
	now := time.Now()
	if h.moved == nil {
		h.moved = map[[2]int]time.Time{}
	}
	for r, at := range h.moved {
		if now.Sub(at) > MovedGrace {
			delete(h.moved, r)
		}
	}
	h.moved[[2]int{start, end}] = now
	return ended
}

// sessionsOn lists the sessions that run on layers [start, end).
func (h *HopService) sessionsOn(start, end int) []*hopSession {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []*hopSession
	for _, hs := range h.active {
		if hs.se.info.Start == start && hs.se.info.End == end {
			out = append(out, hs)
		}
	}
	return out
}

// Ranges lists the served ranges and whether each admits sessions.
func (h *HopService) Ranges() []ServedRange {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []ServedRange
	for _, se := range h.engines {
		out = append(out, ServedRange{Start: se.info.Start, End: se.info.End, Admitting: se.admitting})
	}
	return out
}

// ServedRange is one range of Ranges.
type ServedRange struct {
	Start, End int
	Admitting  bool
}

// engineFor finds the engine serving exactly [start, end) of model fp, or
// says why there is none. The model is checked under the same lock as the
// lookup: a Retarget between admission's first check and this one cannot
// put a session of the old model on the new model's engine.
func (h *HopService) engineFor(fp string, start, end int) (*servedEngine, *hopError) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if fp != h.fp {
		return nil, codeErr(meshp2pb.ErrorCode_ERROR_CODE_MODEL_MISMATCH, fmt.Sprintf("this hop serves model %.16s, not %.16s", h.fp, fp), h.host.ID())
	}
	var have []string
	for _, se := range h.engines {
		if se.info.Start == start && se.info.End == end {
			if !se.admitting {
				return nil, codeErr(meshp2pb.ErrorCode_ERROR_CODE_NO_CAPACITY, fmt.Sprintf("this hop is moving away from layers %d-%d", start, end), h.host.ID())
			}
			return se, nil
		}
		have = append(have, fmt.Sprintf("%d-%d", se.info.Start, se.info.End))
	}
	if at, ok := h.moved[[2]int{start, end}]; ok && time.Since(at) <= MovedGrace {
		return nil, codeErr(meshp2pb.ErrorCode_ERROR_CODE_NO_CAPACITY, fmt.Sprintf("this hop moved from layers %d-%d to %s", start, end, strings.Join(have, ",")), h.host.ID())
	}
	return nil, codeErr(meshp2pb.ErrorCode_ERROR_CODE_RANGE_MISMATCH, fmt.Sprintf("this hop serves layers %s, route asks %d-%d", strings.Join(have, ","), start, end), h.host.ID())
}
