// Package engine runs GGUF models and model shards in-process with
// llama.cpp, through cgo. It is the only package that links llama.cpp;
// everything that does not run a model (the session protocol, routing, the
// tracker, the network layer, GGUF tooling in engine/gguf) builds without
// cgo.
//
// # Pieces
//
//	llama.go   the cgo build (llama.cpp from the pinned ollama module; flags
//	           from the Makefile), Version and SystemInfo
//	model.go   LoadModel (validated by engine/gguf before llama.cpp sees the
//	           file), ModelInfo, tokenizer, chat template
//	shard.go   Shard: one llama context serving a layer range to many
//	           sessions (Config, Capacity); Session.Forward takes token ids on
//	           the head and hidden states elsewhere, returns hidden states or,
//	           on the tail, a sampled token
//	loop.go    the shard's continuous-batching loop: decode rows first, then
//	           prefill chunks, one llama_decode per iteration
//	kvcells.go the KV cells' order (no holes, the grave, compaction)
//	prefixcache.go  finished sessions' prefixes kept (Session.Keep) and
//	           reused by sessions that start the same way (Session.Adopt)
//	sample.go  Sampling: llama.cpp's sampler chain for the filters and a draw
//	           keyed on (seed, step), so a re-routed session draws the same
//	           numbers; sampling_proto.go turns the wire's SamplingParams
//	           into it (the tail and `generate --local` alike)
//	chain.go   RunChain: shards chained in one process (the reference the
//	           swarm is compared with), MeasureDecode
//	quantize.go  llama.cpp's quantizer (f16, q8_0, q4_0, q6_k, q4_k_m, mxfp4_moe)
//	mp.c, mp.h   the C side: the eval callback that copies the hidden
//	             states out at the shard's last layer (they enter the next
//	             shard through llama_batch.embd), without patching llama.cpp
//
// The conventions of llama.cpp this package relies on, and the start-up
// self-test that checks them (ErrSelfTest), are in patches/README.md.
// Errors callers branch on are the Err* variables of shard.go.
//
// The session package does not import engine: node adapts Shard to
// session.Engine (node/shardengine.go).
package engine
