package client

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp/syntax"
	"strings"
)

// Bounds a JSON schema must keep before llama.cpp's converter sees it.
// The converter (json-schema-to-grammar.cpp, C++) is not written for
// hostile input: an empty repetition ("^*$") indexes an empty vector, a
// long $ref recurses per character in std::regex, a $ref cycle recurses
// without end, a deeply nested pattern recurses per parenthesis — each a
// crash of the gateway — and many optional properties cost time cubic in
// their count. CheckSchema refuses all of these, naming the construct.
const (
	MaxSchemaNodes         = 4096 // JSON values in one schema
	MaxSchemaProperties    = 128  // properties of one object
	MaxSchemaPatternBytes  = 256  // one pattern
	MaxSchemaPatternDepth  = 8    // groups nested in a pattern
	MaxSchemaRepeat        = 256  // a pattern's {m,n} and a schema's length and item bounds
	MaxSchemaRefBytes      = 256  // one $ref
	MaxSchemaRefExpansions = 4096 // $refs followed while checking for cycles
	// MaxSchemaMergedProperties bounds the properties one allOf merges
	// into one object. The converter merges allOf components (and the
	// anyOf alternatives inside one, as optional properties), following
	// $refs, and builds optional-property chains in time cubic and memory
	// quadratic in the merged count: 400 $refs to one 120-property
	// definition grew a gateway by 1.6 GB in 9 s (issue 37, row 1).
	MaxSchemaMergedProperties = MaxSchemaProperties
	// MaxSchemaTotalProperties bounds the properties the converter writes
	// rules for: every object's, and each allOf's merge counted again.
	// About 110 bytes of grammar each, so past this the grammar is over
	// engine.MaxGrammarBytes anyway: refused before converting, not after.
	MaxSchemaTotalProperties = 384
)

// CheckSchema validates schema (JSON) for the converter; the error names
// the JSON path and the construct.
func CheckSchema(schema []byte) error {
	var root any
	dec := json.NewDecoder(bytes.NewReader(schema))
	dec.UseNumber()
	if err := dec.Decode(&root); err != nil {
		return fmt.Errorf("the schema is not JSON: %w", err)
	}
	c := &schemaChecker{root: root}
	if err := c.walk(root, "#", 0); err != nil {
		return err
	}
	if err := c.cycles(); err != nil {
		return err
	}
	return c.merges()
}

type schemaChecker struct {
	root  any
	nodes int
	refs  []string // every $ref seen (JSON pointers)
	props int      // properties of every object
	allOf []pathed // every allOf seen
}

type pathed struct {
	path string
	v    []any
}

func (c *schemaChecker) walk(v any, path string, depth int) error {
	if c.nodes++; c.nodes > MaxSchemaNodes {
		return fmt.Errorf("the schema has more than %d values", MaxSchemaNodes)
	}
	if depth > 64 {
		return fmt.Errorf("%s: nested more than 64 deep", path)
	}
	switch x := v.(type) {
	case []any:
		for i, e := range x {
			if err := c.walk(e, fmt.Sprintf("%s/%d", path, i), depth+1); err != nil {
				return err
			}
		}
	case map[string]any:
		for k, e := range x {
			p := path + "/" + k
			switch k {
			case "pattern":
				if s, ok := e.(string); ok {
					if err := checkPattern(s); err != nil {
						return fmt.Errorf("%s: %w", p, err)
					}
				}
			case "$ref":
				s, ok := e.(string)
				if !ok {
					return fmt.Errorf("%s: $ref must be a string", p)
				}
				if err := c.checkRef(s); err != nil {
					return fmt.Errorf("%s: %w", p, err)
				}
				c.refs = append(c.refs, s)
			case "properties":
				if m, ok := e.(map[string]any); ok {
					if len(m) > MaxSchemaProperties {
						return fmt.Errorf("%s: %d properties, more than the %d allowed", p, len(m), MaxSchemaProperties)
					}
					c.props += len(m)
				}
			case "allOf":
				if a, ok := e.([]any); ok {
					c.allOf = append(c.allOf, pathed{p, a})
				}
			case "minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties":
				if n, ok := e.(json.Number); ok {
					if f, err := n.Float64(); err != nil || f > MaxSchemaRepeat {
						return fmt.Errorf("%s: %s of at most %d supported", p, k, MaxSchemaRepeat)
					}
				}
			}
			if err := c.walk(e, p, depth+1); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkRef allows local JSON pointers that resolve.
func (c *schemaChecker) checkRef(ref string) error {
	if len(ref) > MaxSchemaRefBytes {
		return fmt.Errorf("$ref of %d bytes, more than the %d allowed", len(ref), MaxSchemaRefBytes)
	}
	if ref != "#" && !strings.HasPrefix(ref, "#/") {
		return fmt.Errorf("$ref %q: only local references (#/…) are supported", ref)
	}
	if _, ok := resolvePointer(c.root, ref); !ok {
		return fmt.Errorf("$ref %q does not resolve in the schema", ref)
	}
	return nil
}

// cycles refuses $refs that lead back to themselves (recursive schemas:
// the converter expands them without end).
func (c *schemaChecker) cycles() error {
	done := map[string]bool{}
	expansions := 0
	var visit func(v any, onPath map[string]bool) error
	visit = func(v any, onPath map[string]bool) error {
		switch x := v.(type) {
		case []any:
			for _, e := range x {
				if err := visit(e, onPath); err != nil {
					return err
				}
			}
		case map[string]any:
			if ref, ok := x["$ref"].(string); ok {
				if onPath[ref] {
					return fmt.Errorf("$ref %q refers back to itself: recursive schemas are not supported", ref)
				}
				if !done[ref] {
					if expansions++; expansions > MaxSchemaRefExpansions {
						return fmt.Errorf("the schema's $refs expand more than %d times", MaxSchemaRefExpansions)
					}
					target, _ := resolvePointer(c.root, ref)
					onPath[ref] = true
					err := visit(target, onPath)
					delete(onPath, ref)
					if err != nil {
						return err
					}
					done[ref] = true
				}
			}
			for k, e := range x {
				if k == "$ref" {
					continue
				}
				if err := visit(e, onPath); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if len(c.refs) == 0 {
		return nil
	}
	return visit(c.root, map[string]bool{})
}

// merges counts the properties each allOf merges into one object, as the
// converter does (its components, the alternatives of an anyOf among
// them, each followed through $refs), and the properties of the whole
// schema with every merge counted again; over either bound the schema is
// refused before the converter runs. Called after cycles (no $ref loops).
func (c *schemaChecker) merges() error {
	total := c.props
	for _, a := range c.allOf {
		merged := 0
		for _, t := range a.v {
			if m, ok := t.(map[string]any); ok {
				if alts, ok := m["anyOf"].([]any); ok {
					for _, tt := range alts {
						merged += c.componentProps(tt, 0)
					}
					continue
				}
			}
			merged += c.componentProps(t, 0)
		}
		if merged > MaxSchemaMergedProperties {
			return fmt.Errorf("%s merges %d properties into one object, more than the %d allowed", a.path, merged, MaxSchemaMergedProperties)
		}
		if total += merged; total > MaxSchemaTotalProperties {
			break
		}
	}
	if total > MaxSchemaTotalProperties {
		return fmt.Errorf("the schema has more than %d properties (allOf merges counted again): its grammar would be too large", MaxSchemaTotalProperties)
	}
	return nil
}

// componentProps is the properties one allOf component adds: a $ref's
// target's, else its own.
func (c *schemaChecker) componentProps(v any, depth int) int {
	m, ok := v.(map[string]any)
	if !ok || depth > MaxSchemaRefExpansions {
		return 0
	}
	if ref, ok := m["$ref"].(string); ok {
		target, _ := resolvePointer(c.root, ref)
		return c.componentProps(target, depth+1)
	}
	props, _ := m["properties"].(map[string]any)
	return len(props)
}

// resolvePointer resolves a local JSON pointer (#/a/b, ~0 and ~1 escapes).
func resolvePointer(root any, ref string) (any, bool) {
	v := root
	rest := strings.TrimPrefix(strings.TrimPrefix(ref, "#"), "/")
	if rest == "" {
		return v, true
	}
	for _, part := range strings.Split(rest, "/") {
		part = strings.ReplaceAll(strings.ReplaceAll(part, "~1", "/"), "~0", "~")
		switch x := v.(type) {
		case map[string]any:
			e, ok := x[part]
			if !ok {
				return nil, false
			}
			v = e
		case []any:
			i := 0
			if _, err := fmt.Sscanf(part, "%d", &i); err != nil || i < 0 || i >= len(x) {
				return nil, false
			}
			v = x[i]
		default:
			return nil, false
		}
	}
	return v, true
}

// checkPattern allows what the converter handles safely: an anchored
// regular expression of bounded size, group nesting and repetition counts,
// that Go's parser accepts (a repetition needs something to repeat).
func checkPattern(p string) error {
	if len(p) > MaxSchemaPatternBytes {
		return fmt.Errorf("pattern of %d bytes, more than the %d allowed", len(p), MaxSchemaPatternBytes)
	}
	if !strings.HasPrefix(p, "^") || !strings.HasSuffix(p, "$") {
		return fmt.Errorf("pattern %q: it must start with ^ and end with $", p)
	}
	if err := quantifiedAtoms(p[1 : len(p)-1]); err != nil {
		return fmt.Errorf("pattern %q: %w", p, err)
	}
	re, err := syntax.Parse(p, syntax.Perl)
	if err != nil {
		return fmt.Errorf("pattern %q: %w", p, err)
	}
	var check func(r *syntax.Regexp, depth int) error
	check = func(r *syntax.Regexp, depth int) error {
		if depth > MaxSchemaPatternDepth*2 {
			return fmt.Errorf("pattern %q: nested more than %d deep", p, MaxSchemaPatternDepth)
		}
		switch r.Op {
		case syntax.OpRepeat:
			if r.Max > MaxSchemaRepeat || r.Min > MaxSchemaRepeat {
				return fmt.Errorf("pattern %q: repetitions of at most %d supported", p, MaxSchemaRepeat)
			}
		}
		if r.Flags&syntax.NonGreedy != 0 {
			return fmt.Errorf("pattern %q: lazy repetitions are not supported", p)
		}
		for _, s := range r.Sub {
			if err := check(s, depth+1); err != nil {
				return err
			}
		}
		return nil
	}
	return check(re, 0)
}

// quantifiedAtoms allows the regular-expression subset the converter
// parses safely (its own parser, not Go's, runs on the gateway): every
// repetition repeats something (not at the start, after "(" or "|", or
// after another repetition: "^*" crashed it), "{" only as a complete
// {m}, {m,} or {m,n} and "}" and "]" only closing what they close (a
// stray brace made it loop for ever), anchors only at the ends, no empty
// alternative or group. Literal metacharacters are escaped.
func quantifiedAtoms(p string) error {
	atom := false
	depth := 0
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch {
		case c == '\\':
			if i+1 >= len(p) {
				return fmt.Errorf("a trailing backslash")
			}
			i++
			atom = true
		case c == '[':
			j := i + 1
			if j < len(p) && p[j] == '^' {
				j++
			}
			start := j
			for j < len(p) && p[j] != ']' {
				if p[j] == '\\' {
					j++
				}
				j++
			}
			if j >= len(p) || j == start {
				return fmt.Errorf("a character class at byte %d is empty or not closed", i+1)
			}
			i, atom = j, true
		case c == '(':
			if i+1 < len(p) && (p[i+1] == ')' || p[i+1] == '|') {
				return fmt.Errorf("an empty group or alternative at byte %d", i+1)
			}
			depth++
			atom = false
		case c == '|':
			if i+1 >= len(p) || p[i+1] == ')' || p[i+1] == '|' || !atom {
				return fmt.Errorf("an empty alternative at byte %d", i+1)
			}
			atom = false
		case c == ')':
			if depth == 0 || !atom {
				return fmt.Errorf("an unbalanced or empty group at byte %d", i+1)
			}
			depth--
			atom = true
		case c == '*' || c == '+' || c == '?':
			if !atom {
				return fmt.Errorf("a repetition (%q at byte %d) with nothing to repeat", c, i+1)
			}
			atom = false
		case c == '{':
			j := i + 1
			for j < len(p) && (p[j] >= '0' && p[j] <= '9' || p[j] == ',') {
				j++
			}
			if j >= len(p) || p[j] != '}' || j == i+1 || p[i+1] == ',' || strings.Count(p[i+1:j], ",") > 1 {
				return fmt.Errorf("a \"{\" at byte %d that is not a {m}, {m,} or {m,n} repetition (escape a literal one)", i+1)
			}
			if !atom {
				return fmt.Errorf("a repetition at byte %d with nothing to repeat", i+1)
			}
			i, atom = j, false
		case c == '}' || c == ']':
			return fmt.Errorf("a stray %q at byte %d (escape a literal one)", c, i+1)
		case c == '^' || c == '$':
			return fmt.Errorf("an anchor %q inside the pattern (byte %d): only ^ at the start and $ at the end are supported", c, i+1)
		default:
			atom = true
		}
	}
	if depth != 0 {
		return fmt.Errorf("a group is not closed")
	}
	return nil
}
