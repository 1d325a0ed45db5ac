package session

import (
	"math"
	"sync"
	"time"
)

// speedMeter is the hop's measured single-row compute time, advertised per
// layer for the tracker's cost model.
type speedMeter struct {
	layers int

	mu       sync.Mutex
	decodeUs [DecodeWindow]float64 // the last DecodeWindow single-row times per layer (µs)
	n        int
}

// ObserveDecode records one single-row compute time through the hop's
// first range.
func (h *HopService) ObserveDecode(d time.Duration) {
	h.speed.mu.Lock()
	layers := h.speed.layers
	h.speed.mu.Unlock()
	h.observeDecode(d, layers)
}

// observeDecode records one single-row compute time through layers layers.
func (h *HopService) observeDecode(d time.Duration, layers int) {
	m := &h.speed
	m.mu.Lock()
	m.decodeUs[m.n%DecodeWindow] = float64(d.Microseconds()) / float64(max(1, layers))
	m.n++
	m.mu.Unlock()
}

// DecodeSteps counts the single-row steps this hop has computed.
func (h *HopService) DecodeSteps() int {
	h.speed.mu.Lock()
	defer h.speed.mu.Unlock()
	return h.speed.n
}

// DecodeMsPerLayer is the measured single-row compute time per layer: the
// minimum over the recent window (what the shard can do; load is
// advertised separately as capacity). 0 before any live step.
func (h *HopService) DecodeMsPerLayer() float32 {
	m := &h.speed
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.n == 0 {
		return 0
	}
	best := math.Inf(1)
	for _, us := range m.decodeUs[:min(m.n, DecodeWindow)] {
		best = math.Min(best, us)
	}
	return float32(best / 1000)
}
