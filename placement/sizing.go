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
	// HeadBytes is what only the head holds (token embeddings, and the
	// output matrix where Geometry.OutputRequired).
	HeadBytes int64
	// TailBytes is what only the tail holds (output norm and output
	// matrix; a tied output is a copy of the token embeddings).
	TailBytes int64
	// KVBytesPerLayer is one layer's KV cache for the cells the engine
	// allocates (--ctx).
	KVBytesPerLayer int64
	// KVScratchBytesPerLayer is the peak copy of live sessions' KV the
	// batch-invariant engine holds while it compacts its cache (engine
	// kvState): at most the whole cache, once (twice with
	// EngineShape.MergedRestore).
	KVScratchBytesPerLayer int64
	// FixedBytes is the per-shard compute buffer, the batch's hidden
	// states in and out, and the runtime overhead (ComputeEstimate).
	FixedBytes int64
	// TailFixedBytes is what a shard that ends the model adds: the
	// vocabulary's logits for a full batch (the compute buffer's output
	// stage beyond a layer's, and the output buffer they are copied to)
	// and the tokenizer's tables. HeadFixedBytes is the same for a head
	// that does not end the model: a non-tail shard asks for every row
	// as an output (or llama.cpp drops rows from its last layer), and a
	// head holds the vocabulary, so llama.cpp computes and keeps logits
	// for every row it runs, through the tied embeddings.
	TailFixedBytes, HeadFixedBytes int64
	// LoadSlackDiv: loading the weights leaves 1/LoadSlackDiv of them
	// more resident (FromTensors sets the measured DefaultLoadSlackDiv;
	// 0: nothing).
	LoadSlackDiv int
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
	var w, n int64 // weights, the rest
	for l := r.Start; l < r.End && l < len(s.LayerBytes); l++ {
		w += s.LayerBytes[l]
		n += s.KVBytesPerLayer + s.KVScratchBytesPerLayer
	}
	if r.Start == 0 {
		w += s.HeadBytes
	}
	switch {
	case r.End == s.NLayer: // a whole model is its own tail
		w += s.TailBytes
		n += s.TailFixedBytes
	case r.Start == 0:
		n += s.HeadFixedBytes
	}
	if s.LoadSlackDiv > 0 {
		n += w / int64(s.LoadSlackDiv)
	}
	return s.FixedBytes + w + n
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
	// VocabEntries is the tokenizer's tokens plus its BPE merges (0: NVocab).
	VocabEntries int
	// OutputRequired: llama.cpp needs output.weight in every shard of the
	// architecture (no tied fallback; gguf.OutputRequired): a head shard
	// carries it besides the token embeddings, and a tail besides the
	// copy of it that fills its token_embd slot.
	OutputRequired bool
}

// EngineShape is what the engine allocates per shard.
type EngineShape struct {
	NCtx, NBatch int
	// NSeq is llama.cpp's n_seq_max (sessions, the engine's scratch and
	// grave sequences, the prefix cache's entries; 0: 1): llama.cpp
	// reserves its compute buffer for a batch rounded up to a multiple
	// of it.
	NSeq int
	// KVElemBytes is the KV cache element size (2: llama.cpp's f16 cache).
	KVElemBytes int
	// FlashAttn: no n_head × n_ctx score matrix.
	FlashAttn bool
	// Compacts: the engine compacts its KV cache through a copy of the
	// live sessions' cells (the batch-invariant engine does).
	Compacts bool
	// MergedRestore: the compaction also merges that copy into a second
	// one before restoring it (an M-RoPE shard: engine/kvmerge.go).
	MergedRestore bool
}

// Measured terms of the estimate (docs/placement.md "The memory
// estimate"; TestMemoryAtRealSize with a Q4_K_M llama of n_embd 3072,
// n_ff 8192 and a 50257-token BPE vocabulary at the default engine
// settings, and TestMemoryEstimateAgainstRSS's F16 model with a
// 32000-token SentencePiece vocabulary):
const (
	// RuntimeOverhead is the fixed cost of a loaded shard besides its
	// tensors and buffers (the llama.cpp context and graph metadata,
	// thread pool, the Go side): 2.4–13.4 MiB measured with the load's
	// slack (below), rounded up.
	RuntimeOverhead = 8 << 20
	// DefaultLoadSlackDiv: loading a shard's weights into memory leaves
	// about 1/DefaultLoadSlackDiv of them more resident (allocator slack
	// of the load: 13.4 MiB for a 223 MiB Q4_K_M middle shard, 2.4 MiB
	// for a 43 MiB F16 one).
	DefaultLoadSlackDiv = 25
	// VocabEntryBytes is what llama.cpp's tokenizer tables hold per
	// token and per BPE merge on a shard with the vocabulary (head and
	// tail; a middle shard has a 1-token stand-in): 27.6 MiB for 50257
	// tokens and 50000 merges, 8.6 MiB for 32000 tokens.
	VocabEntryBytes = 300
	// BatchCopies is how many copies of a batch's hidden states (rows ×
	// n_embd f32) a shard holds while it runs one: the llama_batch's
	// input, the rows it was handed and the rows it returns, the l_out
	// capture and its copy out (5.1 measured for a middle shard), rounded
	// up.
	BatchCopies = 6
)

// FromTensors sizes a model from its tensors (blk.N.* are layer N's;
// token_embd.weight the head's; output*.weight the tail's) for engine e.
func FromTensors(g Geometry, tensors []Tensor, e EngineShape) (Sizing, error) {
	if g.NLayer <= 0 {
		return Sizing{}, fmt.Errorf("placement: model has %d layers", g.NLayer)
	}
	s := Sizing{NLayer: g.NLayer, LayerBytes: make([]int64, g.NLayer), LoadSlackDiv: DefaultLoadSlackDiv}
	var embd, out int64
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
			hasOutput, out = true, t.Bytes
			s.TailBytes += t.Bytes
		default: // output_norm and other globals: the tail's
			s.TailBytes += t.Bytes
		}
	}
	s.HeadBytes = embd
	if !hasOutput {
		s.TailBytes += embd // the tail stores the tied output as its own copy
	}
	if g.OutputRequired {
		s.HeadBytes += out
		s.TailBytes += out
	}
	if e.KVElemBytes == 0 {
		e.KVElemBytes = 2
	}
	s.KVBytesPerLayer = int64(e.NCtx) * int64(g.KVWidth) * int64(e.KVElemBytes)
	if e.Compacts {
		s.KVScratchBytesPerLayer = s.KVBytesPerLayer
		if e.MergedRestore {
			s.KVScratchBytesPerLayer *= 2
		}
	}
	s.FixedBytes, s.TailFixedBytes = ComputeEstimate(g, e)
	s.HeadFixedBytes = s.TailFixedBytes
	return s, nil
}

// ComputeEstimate is one shard's compute and runtime memory (fixed) and
// what a shard holding the vocabulary adds (vocab). llama.cpp reserves its
// compute buffer for the largest stage of the graph, for n_batch rows
// rounded up to a multiple of n_seq_max (T): a layer's stage keeps the
// feed-forward's three n_ff-wide activations and four n_embd-wide rows
// alive (f32; without flash attention also the n_head × n_ctx scores);
// the output stage the logits of every row (n_vocab wide) and two n_embd
// rows. fixed is the layer stage, BatchCopies copies of the batch's
// hidden states and RuntimeOverhead; vocab is the output stage beyond the
// layer stage, the output buffer the logits are copied to (n_batch rows)
// and the tokenizer's tables (VocabEntryBytes per token and merge).
func ComputeEstimate(g Geometry, e EngineShape) (fixed, vocab int64) {
	b := int64(max(1, e.NBatch))
	seq := int64(max(1, e.NSeq))
	rows := (b + seq - 1) / seq * seq
	layer := int64(3*g.NFF + 4*g.NEmbd)
	if !e.FlashAttn {
		layer += int64(g.NHead) * int64(e.NCtx)
	}
	layer *= 4 * rows
	logits := 4*b*int64(g.NVocab) + 8*rows*int64(g.NEmbd)
	fixed = RuntimeOverhead + layer + BatchCopies*4*b*int64(g.NEmbd)
	entries := g.VocabEntries
	if entries <= 0 {
		entries = g.NVocab
	}
	vocab = max(0, logits-layer) + 4*b*int64(g.NVocab) + VocabEntryBytes*int64(entries)
	return fixed, vocab
}
