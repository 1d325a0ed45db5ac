// Package session is meshp2p's route-session protocol, both sides of it:
// the Origin (client: plan, open, prefill, collect tokens, re-route) and the
// HopService (server: admit, run the engine, pass hidden states on, close
// the ring, report and blame). It knows nothing of llama.cpp: a hop talks to
// its model through the Engine interface (node wires engine.Shard in), so
// the package builds and tests with CGO_ENABLED=0 against a fake engine.
//
// # Files
//
//	doc.go           this overview: files, goroutines, lock order
//	host.go          protocol ids (session, ring, audit; a seam move re-opens with resume), the Host interface
//	engine.go        the Engine and EngineSession interfaces the hop runs rows through; Key, ShardInfo
//	defaults.go      every default and timeout, with the reason, and the timeout ladder
//	seam.go          Seam: one stream, its writer and its two locks
//	turn.go          turns: the head's writes on the down seam, in trMu's order but outside it
//	hop.go           HopService and hopSession (state of one session epoch on a hop)
//	admit.go         admission: checks, KV cap and per-origin quota, engine slot, epoch supersede, the accept/refuse reply
//	originauth.go    origin signatures on SessionOpen, freshness, the replay memory (originGuard)
//	silence.go       the doubling refusal of origins whose sessions held a slot and sent nothing
//	grammarbudget.go each origin's grammar time on a tail, charged when its session ends
//	ticket.go        the --require-ticket admission hook and its nonce memory
//	prefix.go        the prefix cache: block chains, scope, adopt and keep, the
//	                 origin's part (docs/architecture.md, "Prefix cache")
//	standby.go       hot standby: the replica an open names, the mirror's bounded queue on the hop
//	                 before the covered hop, the origin's pick and the takeover after a failure
//	headstandby.go   the head's standby: the origin's feed (prompt, committed tokens, progress, close)
//	standbylink.go   what both feeders of a standby share: the drop, the admission, the watch
//	connect.go       the rest of the route: stream to the next hop, the ring to the head
//	dataplane.go     upstream frames → engine → next hop / ring; the head's token loop and verification windows
//	spec.go          speculation: caps, window checks, the head's proposer and windows (specHead)
//	timing.go        HopTiming: each hop's wait, read, decode, compute, encode, write and up times
//	transcript.go    signed transcripts: frame digests, sketches, the transcriber and the checker
//	auditseam.go     hopAudit: all the data path calls of transcripts and audit records; why no package of their own
//	transcribe.go    hopTranscripts, the hopAudit of a session with transcripts: sign, check, keep
//	auditstore.go    what a hop keeps for audits (bounded) and the audit protocol's handler
//	teardown.go      the clean close (final statements, SessionClose down the route), fail (report upstream once), release, blame from downstream reports
//	waits.go         waits that follow the prefill's work (prompt rows × hops' speed), a hop's verdict on a silence blamed on it
//	migrate.go       moving a seam or ring from a relayed to a direct connection
//	speed.go         measured decode speed (advertised for the tracker's cost model)
//	engines.go       the ranges a hop serves (two while it moves, other models beside it): AddEngine, AddModel, StopAdmitting, Drain, Retarget
//	errors.go        wire error codes for engine and stream failures
//	observer.go      HopObserver and OriginObserver (metrics, status), their no-op and fan-out forms
//	origin.go        the client side: Origin.Generate (plan, open, prefill, collect tokens, re-route)
//	failmem.go       FailureMemory: peers an origin avoids after a failure, and peers an audit convicted
//	audit.go         the origin's audits (Auditor) and Judge, the verdict on an audit or a fraud proof
//	replay.go        RunReplay: a hop's recorded frames run again as its data path ran them
//	relaycheck.go    an audit's check of the head's relay against the tail's signed tokens
//
// # Goroutines of one session on a hop
//
// handleSession (the stream handler) admits the session and then runs
// hopSession.run: the idle timer and the end of the session. It starts
// readUpstream (frames from the previous hop or the origin: the compute
// path on every hop but the head's decode steps), watchDownstream for each
// downstream stream (only errors travel upstream), readRing on the head
// (tokens from the tail: the head's decode path), selfRing on a one-hop
// route, migrateWhenDirect for each relayed stream this hop writes, and on
// the hop before a hop with a standby the mirror's writer (mirror.run)
// and the reader of the standby's stream (standbyLink.watch). On the origin, an
// epoch with a head standby runs its feed's writer (headFeed.run) and the
// reader of the standby's stream (standbyLink.watch; standbylink.go).
//
// # Lock order
//
// A lock is only taken while holding locks of earlier levels, never the
// other way round; locks of one level are never held together
// (docs/locks.md lists every lock of the repository with the places each
// pair is taken):
//
//  1. hopSession.trMu: only on the head of a session with transcripts,
//     around each input frame (activation: digests, the engine step, the
//     statement) and around closeTranscripts (the final statement). It
//     is held across the engine step but not across network I/O: the
//     writes on the down seam (the activation, statements, the final
//     statement, SessionClose) go in a turn taken under trMu and are
//     written after it is released, once the turn before has written
//     (turn.go), so they keep the order trMu gave them. HopService.mu:
//     the served engines, the closed flag, the active sessions, the
//     quotas; never held during I/O or with a seam lock. Seam.wmu (one per
//     seam: up, down, ringOut, ringIn) is held for the duration of one
//     frame write, I/O included, and under no other lock of the package;
//     no code holds two seams' wmu at once.
//  2. Under trMu: kept.mu and specHead.mu (held across a draft model's
//     decodes). Seam.ref (under wmu: guards the stream pointer of a seam,
//     held only to read or swap it, never during I/O).
//     Interrupt/Reset/Close/Is/RemotePeer take only ref, which is how a
//     blocked writer is freed. The stream itself is not handed out, so
//     nothing writes on it without wmu.
//  3. auditStore.mu (under kept.mu); the speed meter's mutex (under trMu
//     or HopService.mu); the engine's locks (under trMu, or specHead.mu
//     for a draft model).
//
// Level 3 takes no lock of this package. Leaves, never held together
// with another lock and held for their own maps only: originGuard.mu,
// silenceMemory.mu, grammarBudget.mu, nonceMemory.mu, FailureMemory.mu,
// Auditor.mu.
//
// Two sync.Once bodies block their other callers: hopSession.fail writes
// the error report (FailWriteTimeout per write), and closeEngine closes
// the engine session and takes grammarBudget.mu and HopService.mu (it is
// never entered with HopService.mu held).
//
// Everything else a session shares travels over channels (done, released,
// activity, ring, resumeUp, resumeRing, self, the turns' channels) or is
// fixed at admission; hopSession.produced is only touched by the one
// goroutine that passes tokens on (readRing or selfRing). hopSession.fail
// runs once (sync.Once) and only then closes done.
package session
