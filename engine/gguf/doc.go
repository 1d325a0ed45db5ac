// Package gguf reads, writes, fingerprints, splits and synthesizes GGUF
// model files, in pure Go.
//
// The reader (Open, Read) is built for untrusted input: every count and
// length in the header is checked against the bytes left in the file (and
// MaxMetadataBytes) before anything is allocated, strings and arrays are
// bounded, nested arrays, unknown value types and unknown tensor types are
// rejected, tensor offsets must be packed and aligned exactly as llama.cpp
// requires, and the last tensor must end inside the file. Malformed input
// gives a *FormatError (errors.Is with ErrTruncated, ErrTooLarge,
// ErrBadMagic, ...), never a panic or an allocation larger than the file.
// Metadata keeps file order and typed values (see KV).
//
// The writer (Write, WriteFile) streams tensor data from io.ReaderAt
// sources in fixed-size chunks, so memory use does not depend on model size;
// WriteFile writes atomically (temporary file, fsync, rename).
//
// A model fingerprint (Fingerprint, ComputeDigests) binds architecture,
// hyper-parameters, tokenizer, tensor layout and every weight byte, and is
// built from per-layer digests so that a shard (Split) can carry the proof
// material and show, with VerifyShard / CheckShard, that it holds exactly
// layers [a,b) of that model. Split writes head/middle/tail shard files that
// unpatched llama.cpp loads as ordinary models (see DESIGN.md). Synth writes
// deterministic random-weight llama/qwen2/qwen3/qwen3moe models for tests,
// and ValidateForLoad screens a file before the engine hands it to
// llama.cpp, whose loader aborts the process on some bad metadata.
package gguf
