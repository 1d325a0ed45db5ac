package enginevocab

import (
	"strings"
	"testing"
)

// No JSON schema crashes or hangs the gateway: client.CheckSchema stands
// in front of llama.cpp's converter (the seeds crashed it before: an empty
// repetition, a long $ref, a $ref cycle, nested groups), and whatever
// passes converts or fails with an error.
func FuzzSchemaToGrammar(f *testing.F) {
	for _, s := range []string{
		`{"type":"object","properties":{"a":{"type":"string","maxLength":5},"b":{"enum":[1,"x",null]}},"required":["a"]}`,
		`{"type":"string","pattern":"^*$"}`,
		`{"type":"string","pattern":"^{2}$"}`,
		`{"$ref":"#/` + strings.Repeat("!", 5000) + `"}`,
		`{"type":"object","definitions":{"a":{"$ref":"#/definitions/a"}},"allOf":[{"$ref":"#/definitions/a"}]}`,
		`{"type":"string","pattern":"^` + strings.Repeat("(", 300) + "a" + strings.Repeat(")", 300) + `$"}`,
		`{"$defs":{"c":{"type":"array","items":{"type":"integer","minimum":-5,"maximum":500},"minItems":1,"maxItems":3}},"anyOf":[{"$ref":"#/$defs/c"},{"type":"string","format":"date-time"}]}`,
		`{"type":"string","pattern":"^(a|b)+[^x]{2,3}\\d?$"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, schema []byte) {
		g, err := Vocab{}.SchemaToGrammar(schema)
		if err == nil && g == "" {
			t.Fatalf("no grammar and no error for %q", schema)
		}
	})
}
