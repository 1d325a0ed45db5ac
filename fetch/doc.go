// Package fetch downloads only the tensors of the layers a node serves:
// from peers that hold them (the manifest and tensor protocols, Server and
// Fetcher) or from a GGUF file on an HTTP server by range requests (URL).
// Everything is checked against a manifest that hashes to the model
// fingerprint (gguf.Manifest) before it is trusted; each tensor is staged
// under its sha256 once verified, so a fetch resumes after a crash, and
// the shard file is written by gguf.WriteShard, the code shard split uses.
// The protocols and formats are described in docs/fetch.md. No cgo.
package fetch
