package session

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// servedEngine is one layer range of one model a hop serves. A hop serves
// one range of its model normally and two while it moves
// (docs/placement.md): the new range is added and admits at once, the old
// one stops admitting and drains. A multi-model node's hop may also serve
// whole other models beside it (AddModel).
type servedEngine struct {
	fp        string // the model's fingerprint
	own       bool   // of the hop's own model (its speed is advertised); fixed when added
	eng       Engine
	info      ShardInfo
	admitting bool // guarded by HopService.mu
	// pinned counts sessions being admitted on it (guarded by
	// HopService.mu): a drain waits for them as for open sessions.
	pinned int
}

// pin marks se as used by a session being admitted, unless it stopped
// admitting or left the hop meanwhile (NO_CAPACITY: another route).
func (h *HopService) pin(se *servedEngine) *hopError {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !se.admitting || !slices.Contains(h.engines, se) {
		return codeErr(meshp2pb.ErrorCode_ERROR_CODE_NO_CAPACITY, fmt.Sprintf("this hop is moving away from layers %d-%d", se.info.Start, se.info.End), h.host.ID())
	}
	se.pinned++
	return nil
}

func (h *HopService) unpin(se *servedEngine) {
	h.mu.Lock()
	se.pinned--
	h.mu.Unlock()
}

// rangeKey names a served range: model and layers.
type rangeKey struct {
	fp         string
	start, end int
}

func (se *servedEngine) key() rangeKey { return rangeKey{se.fp, se.info.Start, se.info.End} }

// AddEngine adds a layer range of the hop's model; it admits sessions at
// once. An engine for a range already served is refused.
func (h *HopService) AddEngine(eng Engine) error {
	info := eng.Info()
	h.mu.Lock()
	defer h.mu.Unlock()
	if info.ParentNLayer != h.info.ParentNLayer || info.NEmbd != h.info.NEmbd {
		return fmt.Errorf("session: engine %d-%d is not of this hop's model (%d layers, n_embd %d)", info.Start, info.End, h.info.ParentNLayer, h.info.NEmbd)
	}
	return h.addLocked(h.fp, eng, info, true)
}

// AddModel adds a range of another model than the hop's own (a
// multi-model node's extra model, served beside its own); it admits at
// once. The hop's speed (DecodeMsPerLayer) stays its own model's.
func (h *HopService) AddModel(fingerprint string, eng Engine) error {
	info := eng.Info()
	h.mu.Lock()
	defer h.mu.Unlock()
	if fingerprint == h.fp {
		return fmt.Errorf("session: model %.16s is the hop's own: AddEngine", fingerprint)
	}
	for _, se := range h.engines {
		if se.fp == fingerprint && (se.info.ParentNLayer != info.ParentNLayer || se.info.NEmbd != info.NEmbd) {
			return fmt.Errorf("session: engine %d-%d does not match the other ranges of model %.16s", info.Start, info.End, fingerprint)
		}
	}
	return h.addLocked(fingerprint, eng, info, false)
}

func (h *HopService) addLocked(fp string, eng Engine, info ShardInfo, own bool) error {
	for _, se := range h.engines {
		if se.key() == (rangeKey{fp, info.Start, info.End}) {
			return fmt.Errorf("session: layers %d-%d of model %.16s are already served", info.Start, info.End, fp)
		}
	}
	h.engines = append(h.engines, &servedEngine{fp: fp, own: own, eng: eng, info: info, admitting: true})
	return nil
}

// model is the hop's own model: its fingerprint and geometry.
func (h *HopService) model() (string, ShardInfo) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.fp, h.info
}

// Fingerprint is the fingerprint of the hop's own model now.
func (h *HopService) Fingerprint() string {
	fp, _ := h.model()
	return fp
}

// ErrHopBusy: Retarget was called while the hop still serves a range of
// its own model.
var ErrHopBusy = errors.New("session: the hop still serves layers")

// Retarget makes the hop's own model another one, whose first range is
// eng (a node that moves to another model, docs/placement.md "Many
// models"). Every range of the old model must have been drained first
// (Drain), so no session runs on it; otherwise it returns ErrHopBusy.
// Sessions of the old model are refused from then on (MODEL_MISMATCH).
// Other models' ranges (AddModel) stay; the new model must not be one of
// them.
func (h *HopService) Retarget(fingerprint string, eng Engine) error {
	info := eng.Info()
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, se := range h.engines {
		switch se.fp {
		case h.fp:
			n++
		case fingerprint:
			return fmt.Errorf("session: model %.16s is served beside the hop's own already", fingerprint)
		}
	}
	if n > 0 {
		return fmt.Errorf("%w: %d range(s) of model %.16s", ErrHopBusy, n, h.fp)
	}
	for k := range h.moved {
		if k.fp == h.fp {
			delete(h.moved, k)
		}
	}
	h.fp, h.info = fingerprint, info
	h.engines = append(h.engines, &servedEngine{fp: fingerprint, own: true, eng: eng, info: info, admitting: true})
	h.speed.mu.Lock()
	h.speed.layers = max(1, info.End-info.Start)
	h.speed.n = 0
	h.speed.mu.Unlock()
	return nil
}

// StopAdmitting makes the hop refuse new sessions for layers [start, end)
// of its own model (NO_CAPACITY, which origins retry on another route
// without holding it against this peer); open sessions go on.
func (h *HopService) StopAdmitting(start, end int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.stopLocked(rangeKey{h.fp, start, end})
}

func (h *HopService) stopLocked(k rangeKey) {
	for _, se := range h.engines {
		if se.key() == k {
			se.admitting = false
		}
	}
}

// Drain waits until no session runs on layers [start, end) of the hop's
// own model, then removes that engine from the hop; the caller may then
// close it. When ctx ends first, the sessions still open are ended with
// SHUTTING_DOWN (their origins re-route) and waited for. It returns how
// many were ended so.
func (h *HopService) Drain(ctx context.Context, start, end int) int {
	return h.DrainModel(ctx, h.Fingerprint(), start, end)
}

// DrainModel is Drain for layers [start, end) of model fp (the hop's own
// or one added with AddModel).
func (h *HopService) DrainModel(ctx context.Context, fp string, start, end int) int {
	k := rangeKey{fp, start, end}
	h.mu.Lock()
	h.stopLocked(k)
	h.mu.Unlock()
	ended := 0
	for {
		left := h.sessionsOn(k)
		if len(left) == 0 && h.pinnedOn(k) == 0 {
			break
		}
		if ctx.Err() != nil {
			for _, hs := range left {
				hs.fail(codeErr(meshp2pb.ErrorCode_ERROR_CODE_SHUTTING_DOWN, fmt.Sprintf("hop moved away from layers %d-%d", start, end), h.host.ID()))
			}
			for _, hs := range left {
				<-hs.released
			}
			ended += len(left)
			// Sessions still being admitted are refused (the range does
			// not admit); wait for them too, briefly.
			if h.pinnedOn(k) == 0 {
				break
			}
			time.Sleep(20 * time.Millisecond)
			continue
		}
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, se := range h.engines {
		if se.key() == k {
			h.engines = append(h.engines[:i], h.engines[i+1:]...)
			break
		}
	}
	now := time.Now()
	if h.moved == nil {
		h.moved = map[rangeKey]time.Time{}
	}
	for r, at := range h.moved {
		if now.Sub(at) > MovedGrace {
			delete(h.moved, r)
		}
	}
	h.moved[k] = now
	return ended
}

// pinnedOn counts the sessions being admitted on range k.
func (h *HopService) pinnedOn(k rangeKey) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, se := range h.engines {
		if se.key() == k {
			n += se.pinned
		}
	}
	return n
}

// sessionsOn lists the sessions that run on range k.
func (h *HopService) sessionsOn(k rangeKey) []*hopSession {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []*hopSession
	for _, hs := range h.active {
		if hs.se.key() == k {
			out = append(out, hs)
		}
	}
	return out
}

// Ranges lists the served ranges of the hop's own model and whether each
// admits sessions.
func (h *HopService) Ranges() []ServedRange {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []ServedRange
	for _, se := range h.engines {
		if se.fp == h.fp {
			out = append(out, ServedRange{Start: se.info.Start, End: se.info.End, Admitting: se.admitting})
		}
	}
	return out
}

// layersOf is the layer count of model fp as this hop serves it (ok
// false: it serves no range of fp).
func (h *HopService) layersOf(fp string) (int, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if fp == h.fp {
		return h.info.ParentNLayer, true
	}
	for _, se := range h.engines {
		if se.fp == fp {
			return se.info.ParentNLayer, true
		}
	}
	return 0, false
}

// ServedRange is one range of Ranges.
type ServedRange struct {
	Start, End int
	Admitting  bool
}

// engineFor finds the engine serving exactly [start, end) of model fp, or
// says why there is none. The model is looked up under the same lock as
// the range: a Retarget between admission and this lookup cannot put a
// session of one model on another's engine.
func (h *HopService) engineFor(fp string, start, end int) (*servedEngine, *hopError) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var have []string
	known := fp == h.fp
	for _, se := range h.engines {
		if se.fp != fp {
			continue
		}
		known = true
		if se.info.Start == start && se.info.End == end {
			if !se.admitting {
				return nil, codeErr(meshp2pb.ErrorCode_ERROR_CODE_NO_CAPACITY, fmt.Sprintf("this hop is moving away from layers %d-%d", start, end), h.host.ID())
			}
			return se, nil
		}
		have = append(have, fmt.Sprintf("%d-%d", se.info.Start, se.info.End))
	}
	if at, ok := h.moved[rangeKey{fp, start, end}]; ok && time.Since(at) <= MovedGrace {
		return nil, codeErr(meshp2pb.ErrorCode_ERROR_CODE_NO_CAPACITY, fmt.Sprintf("this hop moved from layers %d-%d to %s", start, end, strings.Join(have, ",")), h.host.ID())
	}
	if !known {
		return nil, codeErr(meshp2pb.ErrorCode_ERROR_CODE_MODEL_MISMATCH, fmt.Sprintf("this hop serves model %.16s, not %.16s", h.fp, fp), h.host.ID())
	}
	return nil, codeErr(meshp2pb.ErrorCode_ERROR_CODE_RANGE_MISMATCH, fmt.Sprintf("this hop serves layers %s, route asks %d-%d", strings.Join(have, ","), start, end), h.host.ID())
}
