package client

import (
	"errors"
	"os/exec"
	"strings"
	"testing"
)

// fakeVocab is a tokenizer over a fixed piece table: token i is pieces[i];
// the last token is end-of-generation.
type fakeVocab struct {
	pieces   []string
	template bool
}

func (v *fakeVocab) Tokenize(text string, addSpecial, parseSpecial bool) ([]int32, error) {
	var out []int32
	if addSpecial {
		out = append(out, 0)
	}
	for range strings.Fields(text) {
		out = append(out, 1)
	}
	return out, nil
}
func (v *fakeVocab) TokenPiece(tok int32, special bool) (string, error) { return v.pieces[tok], nil }
func (v *fakeVocab) IsEOG(tok int32) bool                               { return int(tok) == len(v.pieces)-1 }
func (v *fakeVocab) Close()                                             {}
func (v *fakeVocab) ApplyChatTemplate(msgs []Message, add bool) (string, error) {
	if !v.template {
		return "", ErrNoChatTemplate
	}
	var b strings.Builder
	for _, m := range msgs {
		b.WriteString("<" + m.Role + "> " + m.Content + " ")
	}
	return b.String(), nil
}

// A stream turns tokens into final text the same way for every caller:
// end-of-generation tokens add nothing, a split character and a possible
// stop string are held back, the finish reason says why it ended.
func TestStream(t *testing.T) {
	v := &fakeVocab{pieces: []string{"<s>", "ab", "\xe2\x82", "\xac", " EN", "D", "x", "</s>"}}
	cases := []struct {
		name   string
		toks   []int32
		stops  []string
		max    int
		deltas []string
		text   string
		finish string
		stop   bool // the last Token call reported a stop
	}{
		{"plain to max", []int32{1, 1}, nil, 2, []string{"ab", "ab"}, "abab", FinishLength, false},
		{"utf-8 held back", []int32{1, 2, 3}, nil, 3, []string{"ab", "", "€"}, "ab€", FinishLength, false},
		{"eos adds nothing", []int32{1, 7}, nil, 8, []string{"ab", ""}, "ab", FinishEOS, false},
		{"stop across tokens", []int32{1, 4, 5, 6}, []string{"END"}, 8, []string{"ab", " ", ""}, "ab ", FinishStop, true},
		{"stop prefix released at the end", []int32{1, 4}, []string{"END"}, 2, []string{"ab", " ", "EN"}, "ab EN", FinishLength, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			s := NewStream(v, tc.stops, func(d string) { got = append(got, d) })
			stop := false
			for _, tok := range tc.toks {
				if stop = s.Token(tok); stop {
					break
				}
			}
			s.End()
			if strings.Join(got, "|") != strings.Join(tc.deltas, "|") || s.Text() != tc.text || s.Finish(tc.max) != tc.finish || stop != tc.stop {
				t.Fatalf("deltas %q text %q finish %s stop %v; want %q %q %s %v", got, s.Text(), s.Finish(tc.max), stop, tc.deltas, tc.text, tc.finish, tc.stop)
			}
		})
	}
}

// Prompts: plain text tokenized as is; chats through the template; a model
// without one gives ErrNoChatTemplate (the API's 400, generate's --chat
// error).
func TestPromptTokens(t *testing.T) {
	if toks, err := (Prompt{Text: "a b"}).Tokens(&fakeVocab{}); err != nil || len(toks) != 3 {
		t.Fatalf("plain: %v %v", toks, err)
	}
	if toks, err := UserPrompt("a b").Tokens(&fakeVocab{template: true}); err != nil || len(toks) != 4 { // BOS + "<user> a b"
		t.Fatalf("chat: %v %v", toks, err)
	}
	if _, err := UserPrompt("a").Tokens(&fakeVocab{}); !errors.Is(err, ErrNoChatTemplate) {
		t.Fatalf("no template: %v", err)
	}
}

// The client is pure Go: no cgo, no engine, no node (it is what the node's
// serving side does not need); enginevocab is its one link to the engine.
func TestNoEngineOrNodeDependency(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}} {{len .CgoFiles}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	mod := "github.com/neuron-tai/meshp2p/"
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		path, cgo, _ := strings.Cut(line, " ")
		if path == mod+"engine" || path == mod+"node" || path == mod+"api" || (strings.HasPrefix(path, mod) && cgo != "0") {
			t.Errorf("client depends on %s (cgo files: %s)", path, cgo)
		}
	}
	if !strings.Contains(string(out), mod+"session") {
		t.Fatalf("go list output looks wrong:\n%s", out)
	}
}
