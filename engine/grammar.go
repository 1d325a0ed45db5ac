package engine

/*
#include <stdlib.h>
#include "grammar.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"time"
	"unsafe"
)

// Grammar bounds. A grammar is compiled on the tail and applied to every
// candidate token each step, so both its size and its cost per token are
// bounded: the cost of one step is proportional to the candidates times
// the grammar's live parse stacks, and a session whose grammar grows more
// stacks than MaxGrammarStacks fails with ErrGrammar (a pathological,
// ambiguous grammar is a CPU attack on a shared tail).
//
// MaxGrammarBytes keeps a grammar inside the SessionOpen frame that
// carries it to the tail (frame.DefaultMaxHeader, 64 KiB, holds the route,
// tickets and signature too).
//
// A candidate token costs roughly the live stacks times their depth:
// MaxGrammarStackElems bounds their total length. Measured on stories260K
// (TestGrammarCostBounded): 200 optional "a"s in a row keep ~200 shallow
// stacks and one apply over 512 candidates took 356 ms; JSON-schema grammars
// keep a handful. On top of the shape bounds, MaxGrammarTime bounds the time
// one session's grammar may take on the tail in all (its applies and
// accepts, measured): past it the session fails with ErrGrammar, so an
// adversarial grammar within the bounds costs a tail at most that, plus
// one apply.
const (
	MaxGrammarBytes      = 32 << 10
	MaxGrammarStacks     = C.MP_GRAMMAR_MAX_STACKS
	MaxGrammarStackElems = 2048
	MaxGrammarTime       = 5 * time.Second
	// MaxGrammarClass bounds the elements of one character class
	// (a char, a range or a negation each; C.MP_GRAMMAR_MAX_CLASS):
	// JSON-schema grammars use classes of a few elements.
	MaxGrammarClass = C.MP_GRAMMAR_MAX_CLASS
	// MaxGrammarClassWork bounds the class elements at the top of the
	// live stacks, summed: an apply matches every candidate's first code
	// point against each, so this (not the stack count alone) is an
	// apply's cost per candidate. 126 stacks over a 4,000-code-point class
	// (issue 37, row 2) cost 13.9 s of one session's applies on a tail;
	// JSON-schema grammars stay under 100.
	MaxGrammarClassWork = 2048
	// MaxSchemaBytes bounds a JSON schema given to SchemaToGrammar.
	MaxSchemaBytes = 64 << 10
)

// ErrGrammar is a grammar that does not compile, a JSON schema the
// converter cannot handle, or a grammar whose cost or dead end stops a
// generation.
var ErrGrammar = errors.New("engine: grammar")

const grammarErrLen = 1024

// grammar is a compiled grammar (C memory, owned by one sampler).
type grammar struct {
	g *C.mp_grammar
}

func newGrammar(m *Model, src string) (*grammar, error) {
	if len(src) > MaxGrammarBytes {
		return nil, fmt.Errorf("%w: %d bytes, more than the %d allowed", ErrGrammar, len(src), MaxGrammarBytes)
	}
	cs := C.CString(src)
	defer C.free(unsafe.Pointer(cs))
	var buf [grammarErrLen]C.char
	g := C.mp_grammar_new(m.vocab, cs, &buf[0], grammarErrLen)
	if g == nil {
		return nil, fmt.Errorf("%w: %s", ErrGrammar, C.GoString(&buf[0]))
	}
	return &grammar{g: g}, nil
}

func (g *grammar) free() {
	if g != nil && g.g != nil {
		C.mp_grammar_free(g.g)
		g.g = nil
	}
}

// bounded reports a grammar whose live stacks cost too much per token.
func (g *grammar) bounded() error {
	if n := int(C.mp_grammar_stacks(g.g)); n > MaxGrammarStacks {
		return fmt.Errorf("%w: %d parse stacks alive, more than the %d allowed (an ambiguous grammar: its cost per token is too high)", ErrGrammar, n, MaxGrammarStacks)
	}
	if n := int(C.mp_grammar_class_work(g.g)); n > MaxGrammarClassWork {
		return fmt.Errorf("%w: the live parse stacks match %d character-class elements per code point, more than the %d allowed (many stacks over large classes: the grammar's cost per token is too high)", ErrGrammar, n, MaxGrammarClassWork)
	}
	if n := int(C.mp_grammar_stack_elems(g.g)); n > MaxGrammarStackElems {
		return fmt.Errorf("%w: parse stacks %d elements deep in all, more than the %d allowed (nested repetitions: the grammar's cost per token is too high)", ErrGrammar, n, MaxGrammarStackElems)
	}
	return nil
}

// apply masks the candidates the grammar forbids.
func (g *grammar) apply(arr *C.llama_token_data_array) error {
	if err := g.bounded(); err != nil {
		return err
	}
	var buf [grammarErrLen]C.char
	if C.mp_grammar_apply(g.g, arr, &buf[0], grammarErrLen) != 0 {
		return fmt.Errorf("%w: %s", ErrGrammar, C.GoString(&buf[0]))
	}
	return nil
}

// accept advances the grammar past tok, refusing a token it forbids.
func (g *grammar) accept(tok int32) error {
	var buf [grammarErrLen]C.char
	switch C.mp_grammar_accept(g.g, C.llama_token(tok), &buf[0], grammarErrLen) {
	case 0:
		// Also when replaying a re-routed session's tokens, which are
		// applied without an apply in between.
		return g.bounded()
	case 1:
		return fmt.Errorf("%w: token %d is not allowed by the grammar here", ErrGrammar, tok)
	}
	return fmt.Errorf("%w: %s", ErrGrammar, C.GoString(&buf[0]))
}

// CheckGrammar compiles src against m's vocabulary and reports why it
// does not compile (an origin checks a request's grammar with its copy of
// the vocabulary before it opens any hop).
func (m *Model) CheckGrammar(src string) error {
	g, err := newGrammar(m, src)
	if err != nil {
		return err
	}
	g.free()
	return nil
}

// SchemaToGrammar converts a JSON schema to a GBNF grammar (root rule
// "root") with llama.cpp's json-schema-to-grammar; the error names the
// construct the converter cannot handle.
func SchemaToGrammar(schema []byte) (string, error) {
	if len(schema) > MaxSchemaBytes {
		return "", fmt.Errorf("%w: schema of %d bytes, more than the %d allowed", ErrGrammar, len(schema), MaxSchemaBytes)
	}
	cs := C.CString(string(schema))
	defer C.free(unsafe.Pointer(cs))
	var buf [grammarErrLen]C.char
	out := C.mp_schema_to_grammar(cs, &buf[0], grammarErrLen)
	if out == nil {
		return "", fmt.Errorf("%w: %s", ErrGrammar, C.GoString(&buf[0]))
	}
	defer C.free(unsafe.Pointer(out))
	g := C.GoString(out)
	if len(g) > MaxGrammarBytes {
		return "", fmt.Errorf("%w: the schema's grammar takes %d bytes, more than the %d allowed", ErrGrammar, len(g), MaxGrammarBytes)
	}
	return g, nil
}
