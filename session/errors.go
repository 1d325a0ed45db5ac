package session

import (
	"errors"
	"fmt"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/p2p/net/swarm"

	"github.com/neuron-tai/meshp2p/proto/frame"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

var errNoStream = errors.New("session: seam has no stream")

// hopError is a wire error a hop reports upstream (and ends a session with).
type hopError struct{ e *meshp2pb.Error }

func (e *hopError) Error() string {
	return fmt.Sprintf("%s: %s", e.e.GetCode(), e.e.GetMessage())
}

// codeErr builds a report; failed names the peer to re-route around ("":
// nobody, re-routing would not help).
func codeErr(code meshp2pb.ErrorCode, msg string, failed peer.ID) *hopError {
	e := &meshp2pb.Error{Code: code, Message: msg}
	if failed != "" {
		e.FailedPeerId = []byte(failed)
	}
	return &hopError{e}
}

// closedHere reports whether err comes from this host closing the link
// itself: its own end of the connection closed (the host shutting down, or
// its connection manager) or its swarm closed. The peer at the other end
// is then not at fault.
func closedHere(err error) bool {
	var ce *network.ConnError
	if errors.As(err, &ce) && !ce.Remote {
		return true
	}
	return errors.Is(err, swarm.ErrSwarmClosed)
}

// linkErr reports losing the link to other (a later hop, or the head on
// the ring) with err: NEXT_HOP_UNREACHABLE blaming other, unless this
// host closed the link itself (see closedHere), when me is the one to
// re-route around. A host that is shutting down closes its connections one
// at a time; without this, the first one closed would get an innocent
// neighbour excluded over a connection still open.
func linkErr(msg string, err error, other, me peer.ID) *hopError {
	if closedHere(err) {
		return codeErr(meshp2pb.ErrorCode_ERROR_CODE_SHUTTING_DOWN, fmt.Sprintf("%s: %v (closed by this hop)", msg, err), me)
	}
	return codeErr(meshp2pb.ErrorCode_ERROR_CODE_NEXT_HOP_UNREACHABLE, fmt.Sprintf("%s: %v", msg, err), other)
}

// engineErr maps an engine failure on hop me to its wire code. Input the
// engine rejects is blamed on from, the peer that sent it; any other
// failure on me (the origin re-routes around this hop: a peer whose engine
// fails must not end the generation for want of someone to blame).
func engineErr(err error, from, me peer.ID) *hopError {
	switch {
	case errors.Is(err, ErrNoCapacity):
		return codeErr(meshp2pb.ErrorCode_ERROR_CODE_CONTEXT_FULL, err.Error(), "")
	case errors.Is(err, ErrBadInput):
		return codeErr(meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST, err.Error(), from)
	}
	return codeErr(meshp2pb.ErrorCode_ERROR_CODE_INTERNAL, err.Error(), me)
}

// asHopError turns a stream failure into a report blaming blame unless it
// already is one.
func asHopError(err error, blame peer.ID) *hopError {
	var he *hopError
	if errors.As(err, &he) {
		return he
	}
	var re *frame.RemoteError
	if errors.As(err, &re) && re.E != nil {
		return &hopError{re.E}
	}
	code := frame.Code(err)
	if code == meshp2pb.ErrorCode_ERROR_CODE_UNSPECIFIED || code == meshp2pb.ErrorCode_ERROR_CODE_INTERNAL {
		code = meshp2pb.ErrorCode_ERROR_CODE_NEXT_HOP_UNREACHABLE
	}
	return codeErr(code, err.Error(), blame)
}
