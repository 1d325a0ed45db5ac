package chattmpl

import (
	"fmt"
	"strings"
	"unicode"
)

// Names of the helpers that instrument gives the template. They are not
// valid in Python identifiers' usual style, so no real template uses them.
const (
	stepFn   = "__chattmpl_step"
	enterFn  = "__chattmpl_enter"
	leaveFn  = "__chattmpl_leave"
	tojsonFn = "__chattmpl_tojson"
)

// Bounds on the template's structure, checked by instrument.
const (
	maxBlockDepth = 256 // nested {% if/for/macro/... %} blocks
	maxExprDepth  = 256 // nested brackets in one tag
)

// instrument rewrites template source so that rendering can be bounded
// and so that tojson behaves as in transformers:
//
//   - each {% for %} body starts with {{ __chattmpl_step() }}, which counts
//     loop iterations against the step budget and checks the context;
//   - each {% macro %} body is wrapped in {{ __chattmpl_enter() }} ...
//     {{ __chattmpl_leave() }}, which counts calls and bounds the depth of
//     (possibly recursive) macro calls, which would otherwise overflow the
//     Go stack and kill the process;
//   - the filter "| tojson" becomes "| __chattmpl_tojson" (the library's
//     own tojson sorts keys and escapes HTML characters when given indent).
//
// The inserted {{ }} tags print nothing and carry no whitespace-control
// markers, and the library's whitespace handling (trim markers,
// lstrip_blocks, trim_blocks) looks through non-text segments to the
// nearest text, so the rendered output is unchanged.
//
// The tag scanner mirrors the library's (github.com/ardanlabs/jinja
// v1.8.0, scan.go): "{{", "{%" and "{#" open tags, quotes are skipped in
// expressions and statements but not in comments, and {% raw %} blocks are
// left alone. Unclosed tags are copied as they are, for the library to
// report.
func instrument(src string) (string, error) {
	var b strings.Builder
	b.Grow(len(src) + len(src)/8)
	textStart := 0
	inRaw := false
	depth := 0
	for i := 0; i < len(src); {
		if src[i] != '{' || i+1 >= len(src) {
			i++
			continue
		}
		var closer string
		switch src[i+1] {
		case '{':
			closer = "}}"
		case '%':
			closer = "%}"
		case '#':
			closer = "#}"
		default:
			i++
			continue
		}
		comment := closer == "#}"
		j := i + 2
		if j < len(src) && src[j] == '-' {
			j++
		}
		contentStart := j
		contentEnd, end := -1, -1
		for j < len(src) {
			c := src[j]
			if !comment && (c == '\'' || c == '"') {
				j++
				for j < len(src) && src[j] != c {
					if src[j] == '\\' && j+1 < len(src) {
						j++
					}
					j++
				}
				if j < len(src) {
					j++
				}
				continue
			}
			if c == '-' && j+2 < len(src) && src[j+1] == closer[0] && src[j+2] == closer[1] {
				contentEnd, end = j, j+3
				break
			}
			if j+1 < len(src) && c == closer[0] && src[j+1] == closer[1] {
				contentEnd, end = j, j+2
				break
			}
			j++
		}
		if end < 0 {
			break // unclosed: left for the library to report
		}
		b.WriteString(src[textStart:i])
		tag := src[i:end]
		content := src[contentStart:contentEnd]
		textStart, i = end, end

		if comment {
			b.WriteString(tag)
			continue
		}
		if inRaw {
			if closer == "%}" && keyword(content) == "endraw" {
				inRaw = false
			}
			b.WriteString(tag)
			continue
		}
		tag, err := rewriteFilters(tag)
		if err != nil {
			return "", err
		}
		if closer == "}}" {
			b.WriteString(tag)
			continue
		}
		kw := keyword(content)
		switch {
		case kw == "raw":
			inRaw = true
		case kw == "if" || kw == "for" || kw == "macro" || kw == "call" || kw == "filter" || kw == "generation" ||
			(kw == "set" && !strings.Contains(content, "=")):
			depth++
			if depth > maxBlockDepth {
				return "", fmt.Errorf("blocks nested deeper than %d", maxBlockDepth)
			}
		case strings.HasPrefix(kw, "end"):
			depth--
		}
		switch kw {
		case "for":
			b.WriteString(tag)
			b.WriteString("{{ " + stepFn + "() }}")
		case "macro":
			b.WriteString(tag)
			b.WriteString("{{ " + enterFn + "() }}")
		case "endmacro":
			b.WriteString("{{ " + leaveFn + "() }}")
			b.WriteString(tag)
		default:
			b.WriteString(tag)
		}
	}
	b.WriteString(src[textStart:])
	return b.String(), nil
}

// keyword is the statement's first word, as the library reads it.
func keyword(content string) string {
	content = strings.TrimSpace(content)
	for i, r := range content {
		if !unicode.IsLetter(r) && r != '_' {
			return content[:i]
		}
	}
	return content
}

// rewriteFilters renames the tojson filter in one tag and checks bracket
// nesting. Quoted strings are skipped as the library's expression
// tokenizer skips them.
func rewriteFilters(tag string) (string, error) {
	var b strings.Builder
	last := 0
	depth := 0
	for i := 0; i < len(tag); i++ {
		switch c := tag[i]; c {
		case '\'', '"':
			i++
			for i < len(tag) && tag[i] != c {
				if tag[i] == '\\' && i+1 < len(tag) {
					i++
				}
				i++
			}
		case '(', '[':
			depth++
			if depth > maxExprDepth {
				return "", fmt.Errorf("brackets nested deeper than %d", maxExprDepth)
			}
		case ')', ']':
			depth--
		case '{':
			// "{{" / "{%" open the tag itself; a lone '{' is a dict literal.
			if i > 1 {
				depth++
				if depth > maxExprDepth {
					return "", fmt.Errorf("brackets nested deeper than %d", maxExprDepth)
				}
			}
		case '}':
			if i < len(tag)-2 {
				depth--
			}
		case '|':
			j := i + 1
			for j < len(tag) && (tag[j] == ' ' || tag[j] == '\t' || tag[j] == '\n' || tag[j] == '\r') {
				j++
			}
			const name = "tojson"
			if strings.HasPrefix(tag[j:], name) && (j+len(name) == len(tag) || !isIdent(tag[j+len(name)])) {
				b.WriteString(tag[last:j])
				b.WriteString(tojsonFn)
				last = j + len(name)
				i = last - 1
			}
		}
	}
	if last == 0 {
		return tag, nil
	}
	b.WriteString(tag[last:])
	return b.String(), nil
}

func isIdent(c byte) bool {
	return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}
