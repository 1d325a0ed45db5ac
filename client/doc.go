// Package client is the origin side of meshp2p, written once: what turns a
// model name and a prompt into text through the swarm. `meshp2p generate`
// and the HTTP API (api.Swarm) are thin users of it and behave alike.
//
//   - Resolve: a model by network name, fingerprint or unique fingerprint
//     prefix from the capability table, waiting for discovery (gossip,
//     adverts pulled from connected peers, DHT lookups) until some route
//     covers every layer. Never a file: a local model file is the CLI's
//     business (it fingerprints the file and seeds the vocabulary, AddVocab).
//   - Vocab: one fetch of a model's vocabulary from the peers that
//     advertise it (vocab.FetchFirst: hedged, the next peer asked when one
//     fails or after vocab.HedgeDelay, each copy verified against the
//     fingerprint and bounded by vocab.TransferTimeout and vocab.MinRate),
//     cached per fingerprint.
//   - Prompt: plain text, or chat messages through the model's own chat
//     template.
//   - Text: token pieces to final text (UTF-8 held back, stop strings
//     matched across tokens and never emitted).
//   - Generate: all of the above around session.Origin, which plans,
//     opens, re-routes and waits for capacity.
//
// No cgo: the tokenizer is reached through the Vocab interface, which the
// engine implements (client/enginevocab adapts engine.Model); `go list
// -deps ./client` shows no engine.
package client
