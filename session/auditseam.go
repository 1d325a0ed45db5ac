package session

import (
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// hopAudit is the one seam between a hop's data path (dataplane.go,
// turn.go, the clean close in teardown.go) and the audits (docs/trust.md):
// the signed transcripts of what this hop computed, the check of the
// statements of the hop before it, and the records it keeps for an audit
// (auditstore.go). The data path calls these methods and nothing else of
// the audits; it decides where a statement goes (the next hop, or the
// head over the ring) and when (turns), and the close protocol (closing,
// the tail's final statement). A session that asks for no transcripts
// has noAudit, which keeps and checks nothing; one that does has
// hopTranscripts (transcribe.go).
//
// Why not a package of its own: the audit code and the data path need
// each other. The data path needs the transcriber, the checker and the
// record store (this interface's implementation). The audit code needs
// the data path's own types and state: RunReplay (replay.go) runs a hop's
// recorded frames through the Engine / EngineSession interface with its
// Key, EngineParams, Input and Output (engine.go) exactly as compute does;
// the origin's audits (audit.go, relaycheck.go) are methods of Origin,
// started by Generate with the tokens it relayed, and use its Dialer,
// Limits, FailureMemory (a conviction) and observer; the record store is
// keyed by Key and served by HopService's audit protocol handler; the
// bounds and checks follow the speculation caps (speculative,
// MaxSpecDraft: spec.go); statements name the session's open
// (OpenDigest) and failures are wire reports (hopError, codeErr). A
// package audit importing session for those while session imports it
// for the transcriber would be a circle. Breaking it means first moving
// the engine interface, Key and the wire errors to a package below both,
// and turning Origin's call into its audits into a hook the node wires in.
type hopAudit interface {
	// signs reports whether this hop signs statements (the session asks
	// for transcripts and the host has its key); only then are input,
	// done and the head's ordering of its inputs (trMu) used.
	signs() bool
	// input digests an input frame (the head also keeps it).
	input(a *meshp2pb.ActivationHeader, tensors [][]byte)
	// sent digests and keeps an activation this hop sends on; the error
	// is the report to fail with.
	sent(a *meshp2pb.ActivationHeader, payload []byte) error
	// ring digests (and on a tail keeps) a token or a window's result the
	// tail sends the head.
	ring(msg *meshp2pb.StreamMessage)
	// done ends one input frame; when a window is full it returns this
	// hop's statement to send where its output went (nil: none, or kept
	// here on a one-hop route); the error is the report to fail with.
	done() (*meshp2pb.SignedTranscript, error)
	// final signs this hop's last window at a clean close (nil: nothing to
	// send).
	final() (*meshp2pb.SignedTranscript, error)
	// received digests a frame from the hop before this one (the head: a
	// token or result from the tail) for the check of its next
	// statement; an error blames from.
	received(msg *meshp2pb.StreamMessage, tensors [][]byte, from peer.ID) error
	// statement checks and keeps a statement of the hop before this one
	// (the head: the tail's); last: it was that hop's final one. An error
	// blames from.
	statement(st *meshp2pb.SignedTranscript, from peer.ID) (last bool, err error)
	// adopted (the epoch's first frame) signs from then on the n
	// positions this hop adopted from its prefix cache with the digest of
	// their inputs (the head's tokens, elsewhere the rows; nil: unknown),
	// and keeps those inputs for an audit (adopted.go).
	adopted(n int, toks []int32, rows func() []float32)
	// end marks the session's records complete (an audit may fetch them).
	end()
}

// noAudit is the hopAudit of a session that asks for no transcripts.
type noAudit struct{}

func (noAudit) signs() bool                                               { return false }
func (noAudit) input(*meshp2pb.ActivationHeader, [][]byte)                {}
func (noAudit) sent(*meshp2pb.ActivationHeader, []byte) error             { return nil }
func (noAudit) ring(*meshp2pb.StreamMessage)                              {}
func (noAudit) done() (*meshp2pb.SignedTranscript, error)                 { return nil, nil }
func (noAudit) final() (*meshp2pb.SignedTranscript, error)                { return nil, nil }
func (noAudit) received(*meshp2pb.StreamMessage, [][]byte, peer.ID) error { return nil }
func (noAudit) end()                                                      {}
func (noAudit) adopted(int, []int32, func() []float32)                    {}

func (noAudit) statement(_ *meshp2pb.SignedTranscript, from peer.ID) (bool, error) {
	return false, codeErr(meshp2pb.ErrorCode_ERROR_CODE_UNEXPECTED_MESSAGE, "transcript in a session without transcripts", from)
}
