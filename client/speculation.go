package client

import (
	"errors"
	"fmt"
	"strings"

	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// Speculation modes, as `--speculative` and the API take them.
const (
	// SpecAuto proposes tokens (n-gram lookup over the prompt and output)
	// while the measured acceptance rate and costs say it pays, and
	// decodes one token per step otherwise: the default.
	SpecAuto = "auto"
	// SpecOff decodes one token per step.
	SpecOff = "off"
	// SpecNGram proposes whenever the n-gram proposer has tokens, paying
	// or not.
	SpecNGram = "ngram"
	// SpecDraft proposes with the route head's draft model (`start
	// --draft`), by n-gram where the head has none, while it pays.
	SpecDraft = "draft"
)

// SpecModes lists the modes ParseSpeculation takes, for help texts.
func SpecModes() string { return strings.Join([]string{SpecAuto, SpecOff, SpecNGram, SpecDraft}, "|") }

// ErrSpecMode reports a speculation mode that is unknown or unavailable.
var ErrSpecMode = errors.New("speculation mode")

// ParseSpeculation is the Request.Speculation of a mode name ("" is
// auto); off is nil. Output never depends on it: speculation only changes
// how many tokens one pass around the route commits.
func ParseSpeculation(mode string) (*meshp2pb.Speculation, error) {
	switch strings.ToLower(strings.TrimSpace(mode)) {
	case SpecAuto, "":
		return &meshp2pb.Speculation{Mode: meshp2pb.SpecMode_SPEC_MODE_AUTO}, nil
	case SpecOff:
		return nil, nil
	case SpecNGram:
		return &meshp2pb.Speculation{Mode: meshp2pb.SpecMode_SPEC_MODE_NGRAM}, nil
	case SpecDraft:
		return &meshp2pb.Speculation{Mode: meshp2pb.SpecMode_SPEC_MODE_DRAFT}, nil
	}
	return nil, fmt.Errorf("%w %q: want one of %s", ErrSpecMode, mode, SpecModes())
}

// SpecModeName is the mode name of s (off for nil).
func SpecModeName(s *meshp2pb.Speculation) string {
	switch s.GetMode() {
	case meshp2pb.SpecMode_SPEC_MODE_AUTO:
		return SpecAuto
	case meshp2pb.SpecMode_SPEC_MODE_NGRAM:
		return SpecNGram
	case meshp2pb.SpecMode_SPEC_MODE_DRAFT:
		return SpecDraft
	}
	return SpecOff
}
