package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/neuron-tai/meshp2p/internal/testmodels"
)

// generate runs prompt on a whole-model shard with smp until an
// end-of-generation token or max tokens; it returns the text, whether it
// ended on EOG, and each token's log-probabilities.
func generate(t *testing.T, m *Model, s *Shard, key byte, prompt string, smp Sampling, max int) (string, bool, []*TokenLogprob, error) {
	t.Helper()
	toks, err := m.Tokenize(prompt, true, false)
	if err != nil {
		t.Fatal(err)
	}
	sess, err := s.OpenSession(SessionKey{ID: [16]byte{key}}, SessionParams{KVTokens: len(toks) + max + 1, Sampling: smp})
	if err != nil {
		return "", false, nil, err
	}
	defer sess.Close()
	var sb strings.Builder
	var lps []*TokenLogprob
	in := Input{Pos: 0, Tokens: toks, Sample: true}
	for i := 0; i < max; i++ {
		out, err := sess.Forward(context.Background(), in)
		if err != nil {
			return sb.String(), false, lps, err
		}
		lps = append(lps, out.Logprob)
		if m.IsEOG(out.Token) {
			return sb.String(), true, lps, nil
		}
		p, err := m.TokenPiece(out.Token, false)
		if err != nil {
			t.Fatal(err)
		}
		sb.WriteString(p)
		in = Input{Pos: in.Pos + len(in.Tokens), Tokens: []int32{out.Token}, Sample: true}
	}
	return sb.String(), false, lps, nil
}

// Output constrained by a JSON schema's grammar parses and validates
// against the schema, greedy and sampled, on a model that knows nothing of
// JSON (stories260K writes children's stories).
func TestSchemaGrammarOutputValidates(t *testing.T) {
	m, s := loadWhole(t, testmodels.Path(t, "stories260K.gguf"))
	schemas := []struct{ name, schema string }{
		{"enum and bounded string", `{"type":"object","properties":{"name":{"type":"string","maxLength":8},"mood":{"enum":["happy","sad","calm"]}},"required":["name","mood"],"additionalProperties":false}`},
		{"nested object and array", `{"type":"object","properties":{"owner":{"type":"object","properties":{"age":{"type":"integer","minimum":0,"maximum":120},"pets":{"type":"array","items":{"type":"string","maxLength":5},"maxItems":3}},"required":["age","pets"],"additionalProperties":false}},"required":["owner"],"additionalProperties":false}`},
		{"booleans numbers const", `{"type":"object","properties":{"ok":{"type":"boolean"},"score":{"type":"number"},"kind":{"const":"story"}},"required":["ok","score","kind"],"additionalProperties":false}`},
		{"anyOf", `{"anyOf":[{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"],"additionalProperties":false},{"type":"object","properties":{"b":{"type":"boolean"}},"required":["b"],"additionalProperties":false}]}`},
		{"array of objects", `{"type":"array","items":{"type":"object","properties":{"id":{"type":"integer"},"tag":{"enum":["x","y"]}},"required":["id","tag"],"additionalProperties":false},"minItems":1,"maxItems":2}`},
		{"pattern", `{"type":"object","properties":{"code":{"type":"string","pattern":"^[a-z]{2,4}-[0-9]{2}$"}},"required":["code"],"additionalProperties":false}`},
		{"optional fields", `{"type":"object","properties":{"title":{"type":"string","maxLength":6},"year":{"type":"integer","minimum":1900,"maximum":2100},"tags":{"type":"array","items":{"enum":["a","b"]},"maxItems":2}},"required":["title"],"additionalProperties":false}`},
		{"string formats", `{"type":"object","properties":{"day":{"type":"string","format":"date"}},"required":["day"],"additionalProperties":false}`},
	}
	for i, sc := range schemas {
		t.Run(sc.name, func(t *testing.T) {
			g, err := SchemaToGrammar([]byte(sc.schema))
			if err != nil {
				t.Fatal(err)
			}
			c := jsonschema.NewCompiler()
			doc, err := jsonschema.UnmarshalJSON(strings.NewReader(sc.schema))
			if err != nil {
				t.Fatal(err)
			}
			if err := c.AddResource("s.json", doc); err != nil {
				t.Fatal(err)
			}
			val, err := c.Compile("s.json")
			if err != nil {
				t.Fatal(err)
			}
			for j, smp := range []Sampling{{}, {Temperature: 1, Seed: 7}, {Temperature: 1.5, TopK: 40, Seed: uint64(100 + i)}} {
				smp.Grammar = g
				text, eog, _, err := generate(t, m, s, byte(10*i+j), "Once upon a time", smp, 300)
				if err != nil {
					t.Fatalf("sampling %+v: %v", smp, err)
				}
				if !eog {
					t.Fatalf("sampling %d: no end within 300 tokens: %q", j, text)
				}
				var v any
				if err := json.Unmarshal([]byte(text), &v); err != nil {
					t.Fatalf("sampling %d: output %q is not JSON: %v", j, text, err)
				}
				inst, _ := jsonschema.UnmarshalJSON(strings.NewReader(text))
				if err := val.Validate(inst); err != nil {
					t.Fatalf("sampling %d: output %q does not validate: %v", j, text, err)
				}
				t.Logf("sampling %d: %s", j, text)
			}
		})
	}
}

// Bad grammars and schemas fail with ErrGrammar and a message naming the
// problem; a session refuses a grammar that does not compile.
func TestGrammarErrors(t *testing.T) {
	m, s := loadWhole(t, testmodels.Path(t, "stories260K.gguf"))
	for _, tc := range []struct{ name, schema, want string }{
		{"not json", `{"type":`, "parse"},
		{"dangling ref", `{"type":"object","properties":{"a":{"$ref":"#/definitions/missing"}}}`, "missing"},
		{"unknown type", `{"type":"widget"}`, "widget"},
		{"unanchored pattern", `{"type":"string","pattern":"[a-z]+"}`, "Pattern must start with '^'"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := SchemaToGrammar([]byte(tc.schema))
			if !errors.Is(err, ErrGrammar) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want ErrGrammar naming %q", err, tc.want)
			}
		})
	}
	if _, err := SchemaToGrammar([]byte(`{"description":"` + strings.Repeat("x", MaxSchemaBytes) + `"}`)); !errors.Is(err, ErrGrammar) {
		t.Fatalf("oversize schema: %v", err)
	}
	for _, g := range []string{`root ::= "a" undefined`, `root ::= root "a"`, `root ::= (`, `other ::= "x"`} {
		if err := m.CheckGrammar(g); !errors.Is(err, ErrGrammar) {
			t.Fatalf("grammar %q: %v, want ErrGrammar", g, err)
		}
		if _, err := s.OpenSession(SessionKey{ID: [16]byte{99}}, SessionParams{KVTokens: 16, Sampling: Sampling{Grammar: g}}); !errors.Is(err, ErrGrammar) {
			t.Fatalf("session with grammar %q: %v", g, err)
		}
	}
	if err := m.CheckGrammar(`root ::= "a"+`); err != nil {
		t.Fatal(err)
	}
}

// A re-opened session (a re-route) rebuilds the grammar's state from the
// tokens generated so far and goes on exactly as the first one would;
// tokens the grammar forbids are refused.
func TestGrammarStateRebuiltFromGenerated(t *testing.T) {
	m, s := loadWhole(t, testmodels.Path(t, "stories260K.gguf"))
	g, err := SchemaToGrammar([]byte(`{"type":"object","properties":{"n":{"type":"string","maxLength":12},"k":{"enum":["p","q"]}},"required":["n","k"],"additionalProperties":false}`))
	if err != nil {
		t.Fatal(err)
	}
	smp := Sampling{Temperature: 1, Seed: 3, Grammar: g}
	prompt, _ := m.Tokenize("Once upon a time", true, false)
	// The whole run.
	var all []int32
	{
		sess, err := s.OpenSession(SessionKey{ID: [16]byte{1}}, SessionParams{KVTokens: 200, Sampling: smp})
		if err != nil {
			t.Fatal(err)
		}
		in := Input{Tokens: prompt, Sample: true}
		for len(all) < 100 {
			out, err := sess.Forward(context.Background(), in)
			if err != nil {
				t.Fatal(err)
			}
			all = append(all, out.Token)
			if m.IsEOG(out.Token) {
				break
			}
			in = Input{Pos: in.Pos + len(in.Tokens), Tokens: []int32{out.Token}, Sample: true}
		}
		sess.Close()
	}
	if !m.IsEOG(all[len(all)-1]) || len(all) < 6 {
		t.Fatalf("run %v", all)
	}
	// Cut after k tokens, re-open with Generated and the prefix re-fed.
	k := len(all) / 2
	re := smp
	re.Generated = append([]int32(nil), all[:k]...)
	sess, err := s.OpenSession(SessionKey{ID: [16]byte{2}}, SessionParams{KVTokens: 200, Sampling: re})
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	in := Input{Tokens: append(append([]int32(nil), prompt...), all[:k-1]...), Sample: false}
	if _, err := sess.Forward(context.Background(), in); err != nil {
		t.Fatal(err)
	}
	in = Input{Pos: len(prompt) + k - 1, Tokens: []int32{all[k-1]}, Sample: true}
	for i := k; i < len(all); i++ {
		out, err := sess.Forward(context.Background(), in)
		if err != nil {
			t.Fatal(err)
		}
		if out.Token != all[i] {
			t.Fatalf("token %d after the re-open: %d, want %d", i, out.Token, all[i])
		}
		in = Input{Pos: in.Pos + 1, Tokens: []int32{out.Token}, Sample: true}
	}
	// A history the grammar forbids is refused at open.
	bad := smp
	bad.Generated = []int32{m.BOS(), m.BOS()}
	if _, err := s.OpenSession(SessionKey{ID: [16]byte{3}}, SessionParams{KVTokens: 16, Sampling: bad}); !errors.Is(err, ErrGrammar) {
		t.Fatalf("forbidden history: %v", err)
	}
}

// Log-probabilities are log-softmax of the logits that chose the token:
// checked against the tail's logits for the same step, top-k sorted.
func TestLogprobsMatchLogits(t *testing.T) {
	m, s := loadWhole(t, testmodels.Path(t, "stories260K.gguf"))
	prompt, _ := m.Tokenize("Once upon a time", true, false)
	sess, err := s.OpenSession(SessionKey{ID: [16]byte{1}}, SessionParams{KVTokens: 64, Sampling: Sampling{Temperature: 0.8, Seed: 5, Logprobs: true, TopLogprobs: 5}})
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	out, err := sess.Forward(context.Background(), Input{Tokens: prompt, Sample: true, Logits: true})
	if err != nil {
		t.Fatal(err)
	}
	lp := out.Logprob
	if lp == nil || len(lp.Top) != 5 {
		t.Fatalf("logprob %+v", lp)
	}
	maxL := math.Inf(-1)
	for _, l := range out.Logits {
		maxL = math.Max(maxL, float64(l))
	}
	sum := 0.0
	for _, l := range out.Logits {
		sum += math.Exp(float64(l) - maxL)
	}
	want := func(tok int32) float64 { return float64(out.Logits[tok]) - maxL - math.Log(sum) }
	if d := math.Abs(float64(lp.Logprob) - want(out.Token)); d > 1e-4 {
		t.Fatalf("logprob %v, want %v", lp.Logprob, want(out.Token))
	}
	for i, a := range lp.Top {
		if math.Abs(float64(a.Logprob)-want(a.Token)) > 1e-4 || (i > 0 && a.Logprob > lp.Top[i-1].Logprob) {
			t.Fatalf("top %d: %+v", i, lp.Top)
		}
	}
	for tok, l := range out.Logits {
		if float64(l)-maxL-math.Log(sum) > float64(lp.Top[4].Logprob)+1e-6 && !containsTok(lp.Top, int32(tok)) {
			t.Fatalf("token %d (logit %v) is more likely than the listed top 5 %+v", tok, l, lp.Top)
		}
	}
	if _, err := s.OpenSession(SessionKey{ID: [16]byte{2}}, SessionParams{KVTokens: 8, Sampling: Sampling{TopLogprobs: 21}}); !errors.Is(err, ErrBadInput) {
		t.Fatalf("top_logprobs 21: %v", err)
	}
}

func containsTok(ps []TokenProb, tok int32) bool {
	for _, p := range ps {
		if p.Token == tok {
			return true
		}
	}
	return false
}

// A grammar's cost per token is bounded: grammars that would recurse
// without end in llama.cpp (a crash of the whole process) are refused at
// compile time, and an ambiguous grammar whose parse stacks keep growing
// fails the session with ErrGrammar once they pass MaxGrammarStacks.
func TestGrammarCostBounded(t *testing.T) {
	m, s := loadWhole(t, testmodels.Path(t, "stories260K.gguf"))
	for _, g := range []string{
		`root ::= ("a"* "a"*)* "b"`,
		"root ::= (x)* \"b\"\nx ::= y\ny ::= \"a\"?",
		"root ::= x* \"b\"\nx ::= \"a\"? \"a\"? \"a\"?",
		"root ::= x\nx ::= y \"a\"\ny ::= z\nz ::= x | \"b\"",
	} {
		if err := m.CheckGrammar(g); !errors.Is(err, ErrGrammar) || !strings.Contains(err.Error(), "without consuming input") {
			t.Fatalf("grammar %q: %v, want a refusal", g, err)
		}
	}
	// No cycle, but 2^17 ways to match nothing: llama.cpp would recurse
	// once per way when it advances (a stack overflow).
	nested := `root ::= ` + strings.Repeat("(", 17) + `"a"?` + strings.Repeat("){2}", 17) + ` "z"`
	if err := m.CheckGrammar(nested); !errors.Is(err, ErrGrammar) || !strings.Contains(err.Error(), "steps") && !strings.Contains(err.Error(), "parse stacks") {
		t.Fatalf("nested optional repetitions: %v, want a refusal", err)
	}
	// The same through a JSON schema whose pattern nests repetitions.
	g, err := SchemaToGrammar([]byte(`{"type":"string","pattern":"^(a*)*$"}`))
	if err == nil {
		err = m.CheckGrammar(g)
	}
	if !errors.Is(err, ErrGrammar) {
		t.Fatalf("pattern ^(a*)*$: %v", err)
	}
	var a int32 = -1
	for i := 0; i < m.Info().NVocab; i++ {
		if p, _ := m.TokenPiece(int32(i), false); p == "a" {
			a = int32(i)
		}
	}
	gr, err := newGrammar(m, "root ::= e\ne ::= \"a\" e | \"a\" e e | \"a\" e e e | \"b\"")
	if err != nil {
		t.Fatal(err)
	}
	defer gr.free()
	steps := 0
	for ; steps < 10000; steps++ {
		if err = gr.applyAll(m.Info().NVocab); err != nil {
			break
		}
		if err = gr.accept(a); err != nil {
			break
		}
	}
	if !errors.Is(err, ErrGrammar) || !strings.Contains(err.Error(), "parse stacks") {
		t.Fatalf("after %d steps: %v", steps, err)
	}
	t.Logf("refused after %d tokens: %v", steps, err)
	// Issue 37, row 2: large character classes, matched by every live
	// stack against every candidate, made one apply cost seconds. A class
	// longer than MaxGrammarClass is refused when compiled; classes within
	// it on many stacks are refused before the apply.
	class := func(n int) string {
		var b strings.Builder
		for i := range n {
			b.WriteRune(rune(0x4e00 + i))
		}
		return "[" + b.String() + "]"
	}
	if err := m.CheckGrammar("root ::= " + class(MaxGrammarClass+1) + "+"); !errors.Is(err, ErrGrammar) || !strings.Contains(err.Error(), "character class") {
		t.Fatalf("a class of %d elements: %v, want a refusal", MaxGrammarClass+1, err)
	}
	if err := m.CheckGrammar("root ::= " + class(200) + "+ \"x\""); err != nil {
		t.Fatalf("a class of 200 elements: %v", err)
	}
	var alts []string
	for i := range 16 {
		alts = append(alts, fmt.Sprintf("%s \"%c\"", class(200), 'a'+i))
	}
	wide, err := newGrammar(m, "root ::= "+strings.Join(alts, " | "))
	if err != nil {
		t.Fatal(err)
	}
	defer wide.free()
	if err := wide.applyAll(m.Info().NVocab); !errors.Is(err, ErrGrammar) || !strings.Contains(err.Error(), "character-class elements") {
		t.Fatalf("16 stacks over 200-element classes: %v, want refused before the apply", err)
	}
	// A re-opened session replays its tokens through the same bound.
	var hist []int32
	for range 20 {
		hist = append(hist, a)
	}
	if _, err := s.OpenSession(SessionKey{ID: [16]byte{7}}, SessionParams{KVTokens: 64, Sampling: Sampling{Grammar: "root ::= e\ne ::= \"a\" e | \"a\" e e | \"a\" e e e | \"b\"", Generated: hist}}); !errors.Is(err, ErrGrammar) {
		t.Fatalf("replay: %v", err)
	}
	// Deep stacks: (a?){N} keeps N stacks up to N deep; the total length
	// is bounded, and an apply at the bound is measured.
	deep, err := newGrammar(m, "root ::= x \"b\"\nx ::= "+strings.TrimSpace(strings.Repeat(`"a"? `, 120)))
	if err != nil {
		t.Fatal(err)
	}
	defer deep.free()
	for steps = 0; steps < 120; steps++ {
		t0 := time.Now()
		if err = deep.applyAll(m.Info().NVocab); err != nil {
			break
		}
		if took := time.Since(t0); steps%20 == 0 {
			t.Logf("(a?){120}: apply %d over %d candidates: %v", steps, m.Info().NVocab, took)
		}
		if err = deep.accept(a); err != nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("(a?){120} within the bounds: %d tokens, then %v", steps, err)
	}
}

// Issue 37, row 3: a tail compiled a session's grammar for seconds (30 KB
// of optional items: 10,000 parse stacks at the start, each compared with
// the others as llama.cpp adds it) before the stack bound refused it at
// the first token; four opens serialized admissions for 16 s. The compile
// now measures the stacks every point of the grammar can fan out to, in
// one pass over it, and refuses the grammar before llama.cpp builds it;
// what it accepts is built with at most MaxGrammarStacks stacks at any
// point. The attack's shapes are refused with the reason; grammars of the
// same size that fan out little still compile.
func TestGrammarCompileBounded(t *testing.T) {
	m, _ := loadWhole(t, testmodels.Path(t, "stories260K.gguf"))
	var chain strings.Builder
	chain.WriteString("root ::= r0\n")
	for i := range 1500 {
		fmt.Fprintf(&chain, "r%d ::= \"a\" r%d?\n", i, i+1)
	}
	chain.WriteString("r1500 ::= \"b\"\n")
	for _, c := range []struct {
		name, src string
		refused   bool
	}{
		{"10000 optional items", "root ::= " + strings.Repeat(`x? `, 10000) + "\nx ::= \"a\"", true},
		{"129 optional items", "root ::= " + strings.Repeat(`x? `, 129) + "\nx ::= \"a\"", true},
		{"4000 alternatives", "root ::= " + strings.Repeat(`"ab" | `, 4000) + `"c"`, true},
		{"optional items inside a rule", "root ::= y \"z\"\ny ::= " + strings.Repeat(`x? `, 200) + "\nx ::= \"a\"", true},
		{"100 optional items", "root ::= " + strings.Repeat(`x? `, 100) + "\nx ::= \"a\"", false},
		{"1500 nested optional tails", chain.String(), false},
		{"1000 optional items, each after a letter", "root ::= " + strings.Repeat(`"a" x? `, 1000) + "\nx ::= \"b\"", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := m.CheckGrammar(c.src)
			switch {
			case c.refused && (!errors.Is(err, ErrGrammar) || !strings.Contains(err.Error(), "parse stacks")):
				t.Fatalf("%d bytes: %v, want a refusal naming the parse stacks", len(c.src), err)
			case !c.refused && err != nil:
				t.Fatalf("%d bytes: %v", len(c.src), err)
			}
		})
	}
}
