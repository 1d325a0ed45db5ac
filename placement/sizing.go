package placement

import (
	"fmt"
	"strconv"
	"strings"
)

// Sizing is what serving a window costs in memory, in bytes. It is a small
// description, not a file: FromTensors builds it from tensor names and
// sizes, which a local GGUF header and a fetched manifest both provide.
type Sizing struct {
	NLayer int
	// LayerBytes are the weights of each layer (len NLayer), at the
	// model's actual tensor types.
	LayerBytes []int64
	// HeadBytes is what only the head holds (token embeddings).
	HeadBytes int64
	// TailBytes is what only the tail holds (output norm and output
	// matrix; a tied output is a copy of the token embeddings).
	TailBytes int64
	// KVBytesPerLayer is one layer's KV cache for the cells the engine
	// allocates (--ctx).
	KVBytesPerLayer int64
	// KVScratchBytesPerLayer is the peak copy of live sessions' KV the
	// batch-invariant engine holds while it compacts its cache (engine
	// kvState): at most the whole cache, once.
	KVScratchBytesPerLayer int64
	// FixedBytes is the per-shard compute buffers and runtime overhead
	// (an estimate; ComputeEstimate).
	FixedBytes int64
	// TailFixedBytes is the tail's extra compute (the logits buffer).
	TailFixedBytes int64
	// Cut, if set, says why a window cannot be a shard: the
	// architecture's cut rules (gguf.CheckCut; deepseek2 never takes a
	// shard of 26 or 27 layers). nil: every window can. Every window
	// placement proposes (Candidates, MaxWindow, Heal) is legal.
	Cut func(Range) error `json:"-"`
}

// Legal reports whether r can be a shard (Cut).
func (s Sizing) Legal(r Range) bool { return s.Cut == nil || s.Cut(r) == nil }

// Need is the memory serving r takes.
func (s Sizing) Need(r Range) int64 {
	if r.Len() <= 0 {
		return 0
	}
	n := s.FixedBytes
	for l := r.Start; l < r.End && l < len(s.LayerBytes); l++ {
		n += s.LayerBytes[l] + s.KVBytesPerLayer + s.KVScratchBytesPerLayer
	}
	if r.Start == 0 {
		n += s.HeadBytes
	}
	if r.End == s.NLayer {
		n += s.TailBytes + s.TailFixedBytes
	}
	return n
}

// MaxWindow is the most layers a legal window starting at start may hold
// within budget (0: not even one).
func (s Sizing) MaxWindow(start int, budget int64) int {
	best := 0
	for e := start + 1; e <= s.NLayer; e++ {
		if s.Need(Range{start, e}) <= budget && s.Legal(Range{start, e}) {
			best = e - start
		}
	}
	return best
}

// Tensor is one tensor's name and data size (a GGUF header or a manifest
// entry).
type Tensor struct {
	Name  string
	Bytes int64
}

// Geometry is the model shape the KV and compute estimates need.
type Geometry struct {
	NLayer, NEmbd, NHead, NFF, NVocab int
	// KVWidth is n_embd_k_gqa + n_embd_v_gqa: the KV values one cell
	// holds per layer.
	KVWidth int
}

// EngineShape is what the engine allocates per shard.
type EngineShape struct {
	NCtx, NBatch int
	// KVElemBytes is the KV cache element size (2: llama.cpp's f16 cache).
	KVElemBytes int
	// FlashAttn: no n_head × n_ctx score matrix.
	FlashAttn bool
	// Compacts: the engine compacts its KV cache through a copy of the
	// live sessions' cells (the batch-invariant engine does).
	Compacts bool
}

// RuntimeOverhead is the fixed cost of a loaded shard besides its tensors
// and buffers (context, thread pool, graph metadata, Go side): about 4.5
// MiB measured with compute buffers included (TestMemoryEstimateAgainstRSS),
// rounded up.
const RuntimeOverhead = 8 << 20

// FromTensors sizes a model from its tensors (blk.N.* are layer N's;
// token_embd.weight the head's; output*.weight the tail's) for engine e.
func FromTensors(g Geometry, tensors []Tensor, e EngineShape) (Sizing, error) {
	if g.NLayer <= 0 {
		return Sizing{}, fmt.Errorf("placement: model has %d layers", g.NLayer)
	}
	s := Sizing{NLayer: g.NLayer, LayerBytes: make([]int64, g.NLayer)}
	var embd int64
	hasOutput := false
	for _, t := range tensors {
		if t.Bytes < 0 {
			return Sizing{}, fmt.Errorf("placement: tensor %s has %d bytes", t.Name, t.Bytes)
		}
		switch {
		case strings.HasPrefix(t.Name, "blk."):
			rest := t.Name[len("blk."):]
			i, err := strconv.Atoi(rest[:max(0, strings.IndexByte(rest, '.'))])
			if err != nil || i < 0 || i >= g.NLayer {
				return Sizing{}, fmt.Errorf("placement: tensor %s outside the model's %d layers", t.Name, g.NLayer)
			}
			s.LayerBytes[i] += t.Bytes
		case t.Name == "token_embd.weight":
			embd = t.Bytes
		case t.Name == "output.weight":
			hasOutput = true
			s.TailBytes += t.Bytes
		default: // output_norm and other globals: the tail's
			s.TailBytes += t.Bytes
		}
	}
	s.HeadBytes = embd
	if !hasOutput {
		s.TailBytes += embd // the tail stores the tied output as its own copy
	}
	if e.KVElemBytes == 0 {
		e.KVElemBytes = 2
	}
	s.KVBytesPerLayer = int64(e.NCtx) * int64(g.KVWidth) * int64(e.KVElemBytes)
	if e.Compacts {
		s.KVScratchBytesPerLayer = s.KVBytesPerLayer
	}
	s.FixedBytes, s.TailFixedBytes = ComputeEstimate(g, e)
	return s, nil
}

// ComputeEstimate is llama.cpp's compute buffer for one shard, estimated
// from the largest activations one decode of n_batch rows keeps alive: the
// attention scores (n_head × n_ctx per row, without flash attention), the
// feed-forward (3 × n_ff per row) and a few n_embd-wide rows, in f32, plus
// RuntimeOverhead; the tail adds the logits (n_vocab per row).
func ComputeEstimate(g Geometry, e EngineShape) (fixed, tail int64) {
	rows := int64(max(1, e.NBatch))
	per := int64(3*g.NFF + 8*g.NEmbd)
	if !e.FlashAttn {
		per += int64(g.NHead) * int64(e.NCtx)
	}
	return RuntimeOverhead + 4*rows*per, 4 * rows * int64(g.NVocab)
}
