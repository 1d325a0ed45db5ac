// Package session is meshp2p's route-session protocol, both sides of it:
// the Origin (client: plan, open, prefill, collect tokens, re-route) and the
// HopService (server: admit, run the engine, pass hidden states on, close
// the ring, report and blame). It knows nothing of llama.cpp: a hop talks to
// its model through the Engine interface (node wires engine.Shard in), so
// the package builds and tests with CGO_ENABLED=0 against a fake engine.
//
// # Files
//
//	host.go       protocol ids (session, ring; a seam move re-opens with resume), the Host interface
//	engine.go     the Engine interface the hop runs rows through
//	defaults.go   every default and timeout, with the reason, and the timeout ladder
//	seam.go       Seam: one stream, its writer and its lock
//	hop.go        HopService and hopSession (state of one session epoch on a hop)
//	admit.go      admission: checks, KV cap and per-origin quota, engine slot, epoch supersede, the accept/refuse reply
//	connect.go    the rest of the route: stream to the next hop, the ring to the head
//	dataplane.go  upstream frames → engine → next hop / ring; the head's token loop
//	teardown.go   fail (report upstream once), release, blame from downstream reports
//	migrate.go    moving a seam or ring from a relayed to a direct connection
//	speed.go      measured decode speed (advertised for the tracker's cost model)
//	engines.go    the layer ranges a hop serves (two while it moves): AddEngine, StopAdmitting, Drain
//	errors.go     wire error codes for engine and stream failures
//	ticket.go     the --require-ticket admission hook
//	origin.go     the client side: Origin.Generate
//	relaycheck.go an audit's check of the head's relay against the tail's signed tokens
//
// # Goroutines of one session on a hop
//
// handleSession (the stream handler) admits the session and then runs
// hopSession.run: the idle timer and the end of the session. It starts
// readUpstream (frames from the previous hop or the origin: the compute
// path on every hop but the head's decode steps), watchDownstream for each
// downstream stream (only errors travel upstream), readRing on the head
// (tokens from the tail: the head's decode path), selfRing on a one-hop
// route, and migrateWhenDirect for each relayed stream this hop writes.
//
// # Lock order
//
// A hop has three kinds of locks, always taken in this order and never
// held across anything listed before them:
//
//  1. Seam.wmu (one per seam: up, down, ringOut, ringIn):
//     held for the duration of one frame write, I/O included. No code holds
//     two seams' wmu at once.
//  2. Seam.ref: guards the stream pointer of a seam; held only to read or
//     swap it, never during I/O. Interrupt/Reset/Close/Is/RemotePeer take
//     only ref, which is how a blocked writer is freed. The stream itself
//     is not handed out, so nothing writes on it without wmu.
//  3. HopService.mu (closed flag and the active sessions map) and the
//     speed meter's mutex: leaves, held for map and counter updates only,
//     never while taking a seam lock or doing I/O.
//
// Everything else a session shares travels over channels (done, released,
// activity, ring, resumeUp, resumeRing, self) or is fixed at admission;
// hopSession.produced is only touched by the one goroutine that passes
// tokens on (readRing or selfRing). hopSession.fail runs once (sync.Once)
// and only then closes done.
package session
