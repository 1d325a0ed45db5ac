package client

import (
	"fmt"
	"strings"
	"testing"

	"github.com/neuron-tai/meshp2p/toolcall"
)

// allOfRefs is allOf:[{anyOf:[n x $ref to one k-property definition]}].
func allOfRefs(n, k int) string {
	var props, refs []string
	for i := range k {
		props = append(props, fmt.Sprintf(`"p%d":{"type":"string"}`, i))
	}
	for range n {
		refs = append(refs, `{"$ref":"#/$defs/D"}`)
	}
	return `{"$defs":{"D":{"type":"object","properties":{` + strings.Join(props, ",") + `}}},"allOf":[{"anyOf":[` + strings.Join(refs, ",") + `]}]}`
}

// objects is an object of n properties, each an object of k properties.
func objects(n, k int) string {
	var outer []string
	for i := range n {
		var props []string
		for j := range k {
			props = append(props, fmt.Sprintf(`"q%d":{"type":"string"}`, j))
		}
		outer = append(outer, fmt.Sprintf(`"o%d":{"type":"object","properties":{%s}}`, i, strings.Join(props, ",")))
	}
	return `{"type":"object","properties":{` + strings.Join(outer, ",") + `}}`
}

// Schemas that would crash or stall llama.cpp's converter are refused,
// naming the construct; ordinary ones (Pydantic- and zod-style $defs,
// anchored patterns, formats) pass.
func TestCheckSchema(t *testing.T) {
	ok := []string{
		`{"type":"object","properties":{"city":{"type":"string","maxLength":10},"unit":{"enum":["c","f"]}},"required":["city"]}`,
		`{"$defs":{"City":{"type":"object","properties":{"name":{"type":"string"}}}},"type":"object","properties":{"home":{"$ref":"#/$defs/City"},"work":{"$ref":"#/$defs/City"}}}`,
		`{"definitions":{"a":{"type":"integer"},"b":{"type":"array","items":{"$ref":"#/definitions/a"}}},"$ref":"#/definitions/b"}`,
		`{"type":"string","pattern":"^[a-z]{2,4}-[0-9]{2}$"}`,
		`{"type":"string","format":"date"}`,
		`{"anyOf":[{"type":"integer","minimum":1,"maximum":9},{"type":"boolean"}]}`,
		`{"$defs":{"A":{"type":"object","properties":{"a":{"type":"string"}}}},"allOf":[{"$ref":"#/$defs/A"},{"anyOf":[{"$ref":"#/$defs/A"},{"type":"object","properties":{"b":{"type":"integer"}}}]}]}`,
		objects(3, 120), // 360 properties: under the total bound
	}
	for _, s := range ok {
		if err := CheckSchema([]byte(s)); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	bad := []struct{ name, schema, want string }{
		// Issue 37, row 1: the converter merges allOf/anyOf components
		// through $refs in time cubic in the merged count.
		{"allOf blow-up (400 refs to a 120-property object)", allOfRefs(400, 120), "merges 48000 properties"},
		{"allOf bounded form (12 x 120)", allOfRefs(12, 120), "merges 1440 properties"},
		{"allOf just over", allOfRefs(2, 65), "merges 130 properties"},
		{"many large objects", objects(4, 120), "more than 384 properties"},
		{"empty repetition", `{"type":"string","pattern":"^*$"}`, "nothing to repeat"},
		{"repetition after a group opens", `{"type":"string","pattern":"^(+a)$"}`, "nothing to repeat"},
		{"double repetition", `{"type":"string","pattern":"^a**$"}`, "nothing to repeat"},
		{"empty counted repetition", `{"type":"string","pattern":"^{2}$"}`, "nothing to repeat"},
		{"unanchored", `{"type":"string","pattern":"[a-z]+"}`, "start with ^"},
		{"deep pattern", `{"type":"string","pattern":"^` + strings.Repeat("(", 25) + "a" + strings.Repeat(")", 25) + `$"}`, "nested"},
		{"nested optional counts", `{"type":"string","pattern":"^` + strings.Repeat("(", 17) + "a?" + strings.Repeat("){2}", 17) + `$"}`, "pattern"},
		{"stray brace (the converter looped)", `{"type":"string","pattern":"^(a|)^x]{2,3x+[^x]{2,3}\\d%$"}`, "pattern"},
		{"open brace", `{"type":"string","pattern":"^a{2,3x$"}`, "not a {m}"},
		{"inner anchor", `{"type":"string","pattern":"^a^b$"}`, "anchor"},
		{"empty alternative", `{"type":"string","pattern":"^(a|)$"}`, "empty"},
		{"huge repetition", `{"type":"string","pattern":"^a{0,900}$"}`, "repetitions"},
		{"long pattern", `{"type":"string","pattern":"^` + strings.Repeat("a", 300) + `$"}`, "pattern of"},
		{"long ref", `{"$ref":"#/` + strings.Repeat("!", 50000) + `"}`, "bytes"},
		{"remote ref", `{"$ref":"https://example.com/s.json"}`, "local"},
		{"dangling ref", `{"$ref":"#/$defs/x"}`, "does not resolve"},
		{"ref cycle", `{"type":"object","definitions":{"a":{"$ref":"#/definitions/a"}},"allOf":[{"$ref":"#/definitions/a"}]}`, "itself"},
		{"recursive schema", `{"$defs":{"n":{"type":"object","properties":{"next":{"$ref":"#/$defs/n"}}}},"$ref":"#/$defs/n"}`, "recursive"},
		{"many properties", `{"type":"object","properties":{` + manyProps(2000) + `}}`, "properties"},
		{"long strings", `{"type":"string","minLength":100000}`, "minLength"},
		{"not json", `{"type":`, "not JSON"},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckSchema([]byte(tc.schema))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want one naming %q", err, tc.want)
			}
		})
	}
}

func manyProps(n int) string {
	var sb strings.Builder
	for i := range n {
		if i > 0 {
			sb.WriteByte(',')
		}
		sb.WriteString(`"p` + strings.Repeat("x", i%5) + string(rune('a'+i%26)) + `` + itoa(i) + `":{"type":"integer"}`)
	}
	return sb.String()
}

func itoa(i int) string {
	if i == 0 {
		return "0"
	}
	s := ""
	for ; i > 0; i /= 10 {
		s = string(rune('0'+i%10)) + s
	}
	return s
}

// recordingVocab is a GrammarVocab that records the schema it converts.
type recordingVocab struct{ schemas [][]byte }

func (r *recordingVocab) CheckGrammar(string) error { return nil }
func (r *recordingVocab) SchemaToGrammar(s []byte) (string, error) {
	r.schemas = append(r.schemas, s)
	return "root ::= \"{}\"\n", nil
}
func (r *recordingVocab) TemplateSource() (string, string, string) { return "", "", "" }

// A forced call's grammar keeps each tool's $defs resolvable (Pydantic and
// zod put shared types there): they move to the wrapper's root under a
// per-tool prefix, refs rewritten; the wrapper names the call's rule.
func TestCallGrammarHoistsDefs(t *testing.T) {
	city := `{"$defs":{"City":{"type":"object","properties":{"name":{"type":"string"}}}},"type":"object","properties":{"home":{"$ref":"#/$defs/City"}},"required":["home"]}`
	zone := `{"definitions":{"Z":{"enum":["utc","cet"]}},"type":"object","properties":{"zone":{"$ref":"#/definitions/Z"}}}`
	rv := &recordingVocab{}
	g, err := callGrammar(rv, Tools{List: []Tool{{Name: "where", Parameters: []byte(city)}, {Name: "when", Parameters: []byte(zone)}}, Choice: ToolRequired, Parallel: true}, toolcall.Generic)
	if err != nil {
		t.Fatal(err)
	}
	if len(rv.schemas) != 1 {
		t.Fatalf("%d schemas converted", len(rv.schemas))
	}
	s := string(rv.schemas[0])
	if err := CheckSchema(rv.schemas[0]); err != nil || !strings.Contains(s, `"#/$defs/t0-City"`) || !strings.Contains(s, `"#/$defs/t1-Z"`) {
		t.Fatalf("wrapper schema %s: %v", s, err)
	}
	if !strings.HasPrefix(g, `root ::= "<tool_call>\n" meshp2p-call "\n</tool_call>" ("\n" "<tool_call>\n" meshp2p-call "\n</tool_call>"){0,15}`) || !strings.Contains(g, "meshp2p-call ::=") {
		t.Fatalf("grammar %q", g)
	}
	// A named function is exactly one call.
	g, err = callGrammar(rv, Tools{List: []Tool{{Name: "where", Parameters: []byte(city)}}, Choice: ToolFunction, Function: "where", Parallel: true}, toolcall.Generic)
	if err != nil || strings.Contains(g, "{0,15}") {
		t.Fatalf("named: %q %v", g, err)
	}
	if _, err := callGrammar(rv, Tools{List: []Tool{{Name: "x", Parameters: []byte(`{"type":"object","properties":{"a":{"$ref":"#/properties/b"},"b":{"type":"integer"}}}`)}}, Choice: ToolRequired}, toolcall.Generic); err == nil {
		t.Fatal("a $ref outside $defs was accepted")
	}
}
