package client

import (
	"errors"
	"fmt"
)

// Errors callers branch on (errors.Is). Besides these, Generate returns
// route.ErrAmbiguousModel (a name matching several models), route's
// *NoRouteError (errors.Is route.ErrNoRoute: layers no live peer serves),
// p2p.ErrNoPeers (connected to nobody) and session.ErrGeneration wrapping
// a hop's report (frame.Code tells its code).
var (
	// ErrModelNotFound: no peer known to the client serves a model of
	// that name, fingerprint or prefix (after waiting for discovery).
	ErrModelNotFound = errors.New("client: model not found")
	// ErrNoVocab: no peer serving the model could give its vocabulary.
	ErrNoVocab = errors.New("client: no vocabulary")
	// ErrVocabHeld: AddVocab for a model whose vocabulary the client
	// already holds or is fetching.
	ErrVocabHeld = errors.New("client: vocabulary already held")
	// ErrTooManyModels: the client holds MaxVocabs vocabularies already.
	ErrTooManyModels = errors.New("client: too many models")
	// ErrNoChatTemplate: the model's GGUF file has no chat template, so
	// chat messages cannot be rendered (send a plain prompt instead).
	ErrNoChatTemplate = errors.New("client: model has no chat template")
	// ErrChatTemplate: the chat template could not render the messages.
	ErrChatTemplate = errors.New("client: chat template")
	// ErrEmptyPrompt: the prompt rendered to no tokens.
	ErrEmptyPrompt = errors.New("client: empty prompt")
)

// ContextError: the prompt plus max_tokens exceed the longest session
// the peers serving the model offer (their advertised n_ctx).
type ContextError struct {
	Model        string // the model's id
	PromptTokens int
	MaxTokens    int
	Limit        int
}

func (e *ContextError) Error() string {
	return fmt.Sprintf("prompt (%d tokens) + max_tokens (%d) exceed the %d-token context the peers serving model %s offer",
		e.PromptTokens, e.MaxTokens, e.Limit, e.Model)
}
