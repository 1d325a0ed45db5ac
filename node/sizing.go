package node

import (
	"github.com/neuron-tai/meshp2p/engine"
	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/placement"
)

// ModelSizing sizes a whole GGUF model for engine config ec from its
// header (tensor types as stored): the input placement needs. A manifest
// of the same tensors gives the same Sizing (placement.FromTensors).
func ModelSizing(path string, ec engine.Config) (placement.Sizing, error) {
	sz, _, err := modelSizing(path, ec)
	return sz, err
}

func modelSizing(path string, ec engine.Config) (placement.Sizing, *gguf.Info, error) {
	f, err := gguf.Open(path)
	if err != nil {
		return placement.Sizing{}, nil, err
	}
	defer f.Close()
	return fileSizing(f, ec)
}

// fileSizing is modelSizing from a parsed header (a fetch's manifest).
func fileSizing(f *gguf.File, ec engine.Config) (placement.Sizing, *gguf.Info, error) {
	in, err := f.Info()
	if err != nil {
		return placement.Sizing{}, nil, err
	}
	arch := f.Architecture()
	headDim := in.NEmbd / max(1, in.NHead)
	kdim, vdim := mdIntOr(f.Metadata, arch+".attention.key_length", headDim), mdIntOr(f.Metadata, arch+".attention.value_length", headDim)
	g := placement.Geometry{NLayer: in.NLayer, NEmbd: in.NEmbd, NHead: in.NHead, NFF: max(in.NFF, in.NFFExpert*in.NExpertUsed),
		NVocab: in.VocabSize, KVWidth: (kdim + vdim) * in.NHeadKV, OutputRequired: gguf.OutputRequired(arch)}
	if m, ok := f.Metadata.ArrayLen("tokenizer.ggml.merges"); ok && g.NVocab > 1 {
		g.VocabEntries = g.NVocab + m
	}
	ts := make([]placement.Tensor, len(f.Tensors))
	for i, t := range f.Tensors {
		ts[i] = placement.Tensor{Name: t.Name, Bytes: int64(t.Bytes)}
	}
	ec = withEngineDefaults(ec)
	cells := ec.NCtx
	if !ec.Baseline { // the prefix cache's cells are the context's too
		cells += ec.PrefixCacheCells
	}
	sz, err := placement.FromTensors(g, ts, placement.EngineShape{NCtx: cells, NBatch: ec.NBatch, NSeq: nSeq(ec),
		FlashAttn: !ec.Baseline, Compacts: !ec.Baseline, MergedRestore: gguf.MRoPEShards(arch)})
	md, n := f.Metadata.Clone(), in.NLayer
	sz.Cut = func(r placement.Range) error { return gguf.CheckCut(md, gguf.Range{Start: r.Start, End: r.End}, n) }
	return sz, in, err
}

// nSeq is the n_seq_max the engine gives llama.cpp for ec: its sessions,
// a scratch and a grave sequence, and the prefix cache's entries.
func nSeq(ec engine.Config) int {
	d, err := ec.WithDefaults()
	if err != nil {
		return 1
	}
	n := d.MaxSessions + 2
	if !d.Baseline && d.PrefixCacheCells > 0 {
		n += d.PrefixCacheEntries
	}
	return n
}

func mdIntOr(md gguf.Metadata, key string, def int) int {
	if v, ok := md.Uint(key); ok && v > 0 && v < 1<<20 {
		return int(v)
	}
	return def
}

// withEngineDefaults fills what engine.Config leaves to its defaults.
func withEngineDefaults(ec engine.Config) engine.Config {
	d := DefaultEngine()
	if ec.NCtx == 0 {
		ec.NCtx = d.NCtx
	}
	if ec.NBatch == 0 {
		ec.NBatch = d.NBatch
	}
	return ec
}
