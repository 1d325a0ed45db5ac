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
	in := instrumenter{}
	in.b.Grow(len(src) + len(src)/8)
	textStart := 0
	for i := 0; i < len(src); {
		closer := tagCloser(src, i)
		if closer == "" {
			i++
			continue
		}
		contentStart, contentEnd, end := scanTag(src, i, closer)
		if end < 0 {
			break // unclosed: left for the library to report
		}
		in.b.WriteString(src[textStart:i])
		if err := in.tag(src[i:end], src[contentStart:contentEnd], closer); err != nil {
			return "", err
		}
		textStart, i = end, end
	}
	in.b.WriteString(src[textStart:])
	return in.b.String(), nil
}

// tagCloser is the closer of the tag that opens at src[i] ("}}", "%}" or
// "#}"), or "" if no tag opens there.
func tagCloser(src string, i int) string {
	if src[i] != '{' || i+1 >= len(src) {
		return ""
	}
	switch src[i+1] {
	case '{':
		return "}}"
	case '%':
		return "%}"
	case '#':
		return "#}"
	}
	return ""
}

// scanTag finds the end of the tag that opens at src[i] and closes with
// closer: its content is src[contentStart:contentEnd] (without the trim
// markers) and the tag is src[i:end]. end is -1 if the tag is unclosed.
func scanTag(src string, i int, closer string) (contentStart, contentEnd, end int) {
	comment := closer == "#}"
	j := i + 2
	if j < len(src) && src[j] == '-' {
		j++
	}
	contentStart = j
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
			return contentStart, j, j + 3
		}
		if j+1 < len(src) && c == closer[0] && src[j+1] == closer[1] {
			return contentStart, j, j + 2
		}
		j++
	}
	return contentStart, -1, -1
}

// instrumenter is instrument's output and what it knows of the tags so far.
type instrumenter struct {
	b     strings.Builder
	inRaw bool // inside {% raw %}
	depth int  // open blocks
}

// tag writes one tag (with its content and closer), rewritten.
func (in *instrumenter) tag(tag, content, closer string) error {
	if closer == "#}" {
		in.b.WriteString(tag)
		return nil
	}
	if in.inRaw {
		if closer == "%}" && keyword(content) == "endraw" {
			in.inRaw = false
		}
		in.b.WriteString(tag)
		return nil
	}
	tag, err := rewriteFilters(tag)
	if err != nil {
		return err
	}
	if closer == "}}" {
		in.b.WriteString(tag)
		return nil
	}
	kw := keyword(content)
	switch {
	case kw == "raw":
		in.inRaw = true
	case kw == "if" || kw == "for" || kw == "macro" || kw == "call" || kw == "filter" || kw == "generation" ||
		(kw == "set" && !strings.Contains(content, "=")):
		in.depth++
		if in.depth > maxBlockDepth {
			return fmt.Errorf("blocks nested deeper than %d", maxBlockDepth)
		}
	case strings.HasPrefix(kw, "end"):
		in.depth--
	}
	switch kw {
	case "for":
		in.b.WriteString(tag)
		in.b.WriteString("{{ " + stepFn + "() }}")
	case "macro":
		in.b.WriteString(tag)
		in.b.WriteString("{{ " + enterFn + "() }}")
	case "endmacro":
		in.b.WriteString("{{ " + leaveFn + "() }}")
		in.b.WriteString(tag)
	default:
		in.b.WriteString(tag)
	}
	return nil
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
