package toolcall

import (
	"bytes"
	"encoding/json"
	"strings"
)

// Bounds of a Parser.
const (
	// MaxCalls is the most calls recognised in one output (abandoned calls
	// that emitted a Delta count too); later call syntax is content.
	MaxCalls = 64
	// MaxHeld is the most bytes a Parser holds back. A call whose text grows
	// beyond it is invalid and released as content.
	MaxHeld = 1 << 20
	// maxNameLen bounds a name in the [TOOL_CALLS]name[ARGS] form.
	maxNameLen = 256
)

// Call is a complete, valid tool call.
type Call struct {
	Name string
	// Arguments is the JSON object text of the arguments exactly as the
	// model generated it (usually compact), or "{}" when the call had no
	// arguments member. When the model wrote the arguments as a JSON string
	// holding an object, it is that string's decoded text.
	Arguments string
}

// Delta is a streamed piece of a call. A call's first Delta has its Name;
// Arguments fragments follow (the first Delta may carry one too). Index
// numbers calls from 0 in the order they start; IDs are up to the caller.
type Delta struct {
	Index     int
	Name      string
	Arguments string
}

type pstate uint8

const (
	stContent     pstate = iota // looking for a call marker
	stPlain                     // everything left is content
	stLlamaStart                // Llama3: start of the message
	stBeforeObj                 // after a marker: white space, then '{'
	stObj                       // in a call's JSON object
	stAfterObj                  // Hermes: white space, then </tool_call>
	stMistralOpen               // after [TOOL_CALLS]
	stMistralList               // in [ ... ]: white space, then '{'
	stMistralNext               // after a listed call: ',' or ']'
	stMistralName               // [TOOL_CALLS]name[ARGS]
	stLlamaNext                 // Llama3 after a call: ';' / white space, then '{'
	stClosed
)

const (
	hermesOpen  = "<tool_call>"
	hermesClose = "</tool_call>"
	mistralMark = "[TOOL_CALLS]"
	mistralArgs = "[ARGS]"
	pythonTag   = "<|python_tag|>"
)

// callState is the call whose JSON object is being scanned.
type callState struct {
	scan       *jscan
	objOff     int  // offset in held of the object's first byte
	argsOnly   bool // the object is the arguments ([TOOL_CALLS]name[ARGS]{...})
	key        string
	name       string
	hasName    bool
	index      int // Delta index, or -1 before the name was emitted
	argsStart  int // scanner offset of the arguments value, or -1
	argsEnd    int // scanner offset just past it, or -1 while scanning
	argsString bool
	argsText   string // decoded arguments given as a JSON string
	emitted    int    // scanner offset up to which arguments were emitted
	inList     bool   // Mistral: the call is in a [ ... ] list
}

// Parser splits streamed model output into content and tool calls. See the
// package documentation for the rules. A Parser is not safe for concurrent
// use.
type Parser struct {
	format Format
	known  map[string]bool

	st        pstate
	held      []byte
	tagPos    int  // bytes of the current fixed tag matched
	afterCall bool // stContent: held white space follows a call
	grpCalls  int  // calls completed in the current [TOOL_CALLS] group
	nameStart int  // stMistralName: offset of the name in held
	nameEnd   int  // stMistralName: end of the name, once '[' was seen
	pyTag     bool // stLlamaStart: <|python_tag|> seen
	call      *callState
	nextIndex int
	callIdx   []int // the Delta index of each of calls

	out    strings.Builder
	deltas []Delta
	calls  []Call
}

// NewParser returns a parser for output in format f. known lists the tool
// names that may be called; a call naming another tool is content. An empty
// known accepts any non-empty name.
func NewParser(f Format, known []string) *Parser {
	p := &Parser{format: f}
	if len(known) > 0 {
		p.known = make(map[string]bool, len(known))
		for _, k := range known {
			p.known[k] = true
		}
	}
	if f == Llama3 {
		p.st = stLlamaStart
	}
	return p
}

// Write feeds the next piece of output and returns the content released by
// it and the call deltas it completed. Content released by one Write may
// come from both before and after the calls it reports.
func (p *Parser) Write(text string) (content string, deltas []Delta) {
	if p.st == stClosed {
		return text, nil
	}
	for i := 0; i < len(text); i++ {
		p.feed(text[i])
	}
	p.flushArgs()
	return p.take()
}

// Close ends the output: held text is released as content or, when it is
// the syntax around calls (white space, separators, a cut-off closing tag),
// dropped; a call still open is invalid. calls holds every complete, valid
// call of the whole output, in order.
func (p *Parser) Close() (content string, deltas []Delta, calls []Call) {
	if p.st == stClosed {
		return "", nil, p.calls
	}
	switch p.st {
	case stContent:
		if p.afterCall && p.tagPos == 0 {
			p.drop(len(p.held))
		} else {
			p.releaseAll()
		}
	case stAfterObj, stLlamaNext:
		p.drop(len(p.held)) // white space, separators or part of </tool_call>
	case stMistralList, stMistralNext:
		if p.grpCalls > 0 {
			p.drop(len(p.held))
		} else {
			p.releaseAll()
		}
	case stObj:
		p.fail(false) // cut off: invalid
	default:
		p.releaseAll()
	}
	p.flushArgs()
	p.st = stClosed
	content, deltas = p.take()
	return content, deltas, p.calls
}

// heldLen reports the bytes held back (for tests).
func (p *Parser) heldLen() int { return len(p.held) }

// CallIndexes gives, for each call Close returned (in order), the Delta
// index its fragments carried (abandoned calls leave gaps).
func (p *Parser) CallIndexes() []int { return append([]int(nil), p.callIdx...) }

func (p *Parser) take() (string, []Delta) {
	content := p.out.String()
	p.out.Reset()
	deltas := p.deltas
	p.deltas = nil
	return content, deltas
}

// release writes held[:n] to the content and removes it.
func (p *Parser) release(n int) {
	p.out.Write(p.held[:n])
	p.drop(n)
}

func (p *Parser) releaseAll() { p.release(len(p.held)) }

// drop removes held[:n] without releasing it.
func (p *Parser) drop(n int) {
	rest := copy(p.held, p.held[n:])
	p.held = p.held[:rest]
	if p.call != nil {
		p.call.objOff -= n
	}
	p.nameStart -= n
	p.nameEnd -= n
}

func (p *Parser) marker() string {
	if p.format == Mistral {
		return mistralMark
	}
	return hermesOpen
}

// contentState is where a failed call returns to.
func (p *Parser) contentState() pstate {
	if p.format == Llama3 {
		return stPlain
	}
	return stContent
}

// feed processes one byte of output.
func (p *Parser) feed(c byte) {
	p.held = append(p.held, c)
	for p.step(c) {
		// step released everything held but c and asked to see c again in
		// the new state.
	}
	if len(p.held) > MaxHeld {
		p.overflow()
	}
}

// reprocess releases everything held except the last byte (c) and returns
// true so that c is handled again in state st.
func (p *Parser) reprocess(st pstate) bool {
	p.release(len(p.held) - 1)
	p.st = st
	p.tagPos = 0
	p.afterCall = false
	return true
}

// fail abandons the call syntax being read: everything held, c included,
// becomes content unless c must be seen again (again).
func (p *Parser) fail(again bool) bool {
	if p.call != nil {
		p.abandon()
	}
	st := p.contentState()
	if again && st != stPlain {
		return p.reprocess(st)
	}
	p.releaseAll()
	p.st = st
	p.tagPos = 0
	p.afterCall = false
	return false
}

// overflow handles held text beyond MaxHeld.
func (p *Parser) overflow() {
	switch p.st {
	case stContent, stPlain:
		p.releaseAll()
		p.afterCall = false
		p.tagPos = 0
	case stLlamaNext, stAfterObj, stMistralNext:
		// Only white space after a valid call can pile up here.
		p.releaseAll()
		p.st = p.contentState()
		p.tagPos = 0
	default:
		p.fail(false)
	}
}

// step handles byte c, the last byte held, in the current state. It returns
// true when c must be handled again (in a new state).
func (p *Parser) step(c byte) bool {
	switch p.st {
	case stPlain:
		p.releaseAll()
		return false
	case stContent:
		return p.stepContent(c)
	case stLlamaStart:
		return p.stepLlamaStart(c)
	case stBeforeObj:
		return p.stepBeforeObj(c)
	case stObj:
		return p.stepObj(c)
	case stAfterObj:
		return p.stepAfterObj(c)
	case stMistralOpen:
		return p.stepMistralOpen(c)
	case stMistralList:
		return p.stepMistralList(c)
	case stMistralNext:
		return p.stepMistralNext(c)
	case stMistralName:
		return p.stepMistralName(c)
	case stLlamaNext:
		return p.stepLlamaNext(c)
	}
	return false
}

// stepContent looks for the call marker (p.marker()) in content; white
// space after a call is held.
func (p *Parser) stepContent(c byte) bool {
	m := p.marker()
	if p.tagPos > 0 || c == m[0] {
		if c == m[p.tagPos] {
			p.tagPos++
			if p.tagPos == len(m) {
				p.tagPos = 0
				p.startGroup(len(p.held) - len(m))
			}
			return false
		}
		return p.reprocess(stContent) // c may start the marker again
	}
	if p.afterCall && isWS(c) {
		return false
	}
	p.releaseAll()
	p.afterCall = false
	return false
}

// stepLlamaStart reads the start of a Llama 3 message: an optional
// <|python_tag|>, white space, then a call's '{'.
func (p *Parser) stepLlamaStart(c byte) bool {
	if p.tagPos > 0 || (c == pythonTag[0] && !p.pyTag) {
		if c == pythonTag[p.tagPos] {
			p.tagPos++
			if p.tagPos == len(pythonTag) {
				p.tagPos = 0
				p.pyTag = true
			}
			return false
		}
		return p.fail(false)
	}
	switch {
	case isWS(c):
		return false
	case c == '{':
		if p.nextIndex >= MaxCalls {
			return p.fail(false)
		}
		p.beginCall(false)
		return false
	}
	return p.fail(false)
}

// stepBeforeObj expects white space, then the call object's '{'.
func (p *Parser) stepBeforeObj(c byte) bool {
	if isWS(c) {
		return false
	}
	if c == '{' {
		p.beginCall(p.call != nil && p.call.argsOnly)
		return false
	}
	return p.fail(true)
}

// stepAfterObj expects white space, then </tool_call> after a Hermes call.
func (p *Parser) stepAfterObj(c byte) bool {
	if p.tagPos == 0 && isWS(c) {
		return false
	}
	if c == hermesClose[p.tagPos] {
		p.tagPos++
		if p.tagPos == len(hermesClose) {
			p.tagPos = 0
			p.drop(len(p.held))
			p.st = stContent
			p.afterCall = true
		}
		return false
	}
	return p.reprocess(stContent)
}

// stepMistralOpen reads what follows [TOOL_CALLS]: a list, an object or a
// name.
func (p *Parser) stepMistralOpen(c byte) bool {
	switch {
	case isWS(c):
		return false
	case c == '[':
		p.st = stMistralList
		return false
	case c == '{':
		p.beginCall(false)
		return false
	case isNameByte(c):
		p.st = stMistralName
		p.nameStart = len(p.held) - 1
		p.nameEnd = -1
		p.tagPos = 0
		return false
	}
	return p.fail(true)
}

// stepMistralList expects white space, then a listed call's '{'.
func (p *Parser) stepMistralList(c byte) bool {
	switch {
	case isWS(c):
		return false
	case c == '{':
		p.beginCall(false)
		p.call.inList = true
		return false
	}
	if p.grpCalls > 0 {
		return p.reprocess(stContent)
	}
	return p.fail(true)
}

// stepMistralNext expects ',' or ']' after a listed call.
func (p *Parser) stepMistralNext(c byte) bool {
	switch {
	case isWS(c):
		return false
	case c == ',':
		p.st = stMistralList
		return false
	case c == ']':
		p.drop(len(p.held))
		p.st = stContent
		p.afterCall = true
		return false
	}
	return p.reprocess(stContent)
}

// stepMistralName reads a [TOOL_CALLS]name[ARGS] form up to its arguments
// object.
func (p *Parser) stepMistralName(c byte) bool {
	if p.nameEnd < 0 {
		if isNameByte(c) {
			if len(p.held)-p.nameStart > maxNameLen {
				return p.fail(false)
			}
			return false
		}
		if c != mistralArgs[0] {
			return p.fail(true)
		}
		p.nameEnd = len(p.held) - 1
		p.tagPos = 1
		return false
	}
	if c != mistralArgs[p.tagPos] {
		return p.fail(true)
	}
	p.tagPos++
	if p.tagPos < len(mistralArgs) {
		return false
	}
	p.tagPos = 0
	name := string(p.held[p.nameStart:p.nameEnd])
	if !p.knownName(name) {
		return p.fail(false)
	}
	p.call = &callState{argsOnly: true, name: name, hasName: true, index: -1, argsStart: -1, argsEnd: -1}
	p.st = stBeforeObj
	return false
}

// stepLlamaNext expects separators (';', white space) and then another
// call's '{' after a Llama 3 call; anything else ends the calls.
func (p *Parser) stepLlamaNext(c byte) bool {
	switch {
	case isWS(c) || c == ';':
		return false
	case c == '{':
		if p.nextIndex >= MaxCalls {
			p.releaseAll()
			p.st = stPlain
			return false
		}
		p.beginCall(false)
		return false
	}
	p.releaseAll()
	p.st = stPlain
	return false
}

// startGroup is called when a call marker ends in held; start is where the
// marker begins.
func (p *Parser) startGroup(start int) {
	if p.nextIndex >= MaxCalls {
		p.releaseAll()
		p.st = stPlain
		return
	}
	if p.afterCall {
		p.drop(start) // white space between calls
	} else {
		p.release(start)
	}
	p.afterCall = false
	p.grpCalls = 0
	if p.format == Mistral {
		p.st = stMistralOpen
	} else {
		p.st = stBeforeObj
	}
}

// beginCall starts the call object whose '{' is the last byte held.
func (p *Parser) beginCall(argsOnly bool) {
	cs := p.call
	if cs == nil || !argsOnly {
		cs = &callState{index: -1, argsStart: -1, argsEnd: -1}
	}
	cs.scan = newJScan()
	cs.objOff = len(p.held) - 1
	cs.argsOnly = argsOnly
	if argsOnly {
		cs.argsStart = 0
		p.emitName(cs)
	}
	p.call = cs
	p.st = stObj
	cs.scan.feed('{')
}

func (p *Parser) knownName(name string) bool {
	if name == "" {
		return false
	}
	return p.known == nil || p.known[name]
}

// stepObj feeds c to the call's JSON scanner.
func (p *Parser) stepObj(c byte) bool {
	cs := p.call
	ev := cs.scan.feed(c)
	if cs.scan.failed() {
		return p.fail(true)
	}
	if !cs.argsOnly {
		switch ev {
		case evKeyEnd:
			raw := p.held[cs.objOff+cs.scan.keyStart : cs.objOff+cs.scan.keyEnd]
			cs.key = ""
			if err := json.Unmarshal(raw, &cs.key); err != nil {
				return p.fail(false)
			}
		case evValStart:
			switch cs.key {
			case "name":
				if cs.hasName || c != '"' {
					return p.fail(false)
				}
			case "arguments", "parameters":
				if cs.argsStart >= 0 || (c != '{' && c != '"') {
					return p.fail(false)
				}
				cs.argsStart = cs.scan.valStart
				cs.argsString = c == '"'
				cs.emitted = cs.argsStart
			}
		case evValEnd:
			start, end := cs.scan.takeMember()
			raw := p.held[cs.objOff+start : cs.objOff+end]
			switch cs.key {
			case "name":
				if err := json.Unmarshal(raw, &cs.name); err != nil || !p.knownName(cs.name) {
					return p.fail(false)
				}
				cs.hasName = true
				p.emitName(cs)
			case "arguments", "parameters":
				cs.argsEnd = end
				if cs.argsString {
					var s string
					if err := json.Unmarshal(raw, &s); err != nil || !isJSONObject(s) {
						return p.fail(false)
					}
					cs.argsText = s
				}
			}
		}
	}
	if !cs.scan.done() {
		return false // arguments are flushed at the end of Write
	}
	if !cs.hasName {
		return p.fail(false)
	}
	p.finishCall()
	return false
}

// emitName emits the first Delta of a call whose name is known.
func (p *Parser) emitName(cs *callState) {
	cs.index = p.nextIndex
	p.nextIndex++
	p.deltas = append(p.deltas, Delta{Index: cs.index, Name: cs.name})
	p.flushCallArgs(cs)
}

// flushCallArgs emits the arguments text of cs received so far.
func (p *Parser) flushCallArgs(cs *callState) {
	if cs.index < 0 || cs.argsStart < 0 || cs.argsString {
		return
	}
	end := cs.scan.n
	if cs.argsEnd >= 0 {
		end = cs.argsEnd
	}
	if end > cs.emitted {
		p.emitArgs(cs.index, string(p.held[cs.objOff+cs.emitted:cs.objOff+end]))
		cs.emitted = end
	}
}

func (p *Parser) flushArgs() {
	if p.st == stObj && p.call != nil {
		p.flushCallArgs(p.call)
	}
}

// emitArgs adds an arguments fragment, merging it into the last Delta when
// that is of the same call.
func (p *Parser) emitArgs(index int, frag string) {
	if n := len(p.deltas); n > 0 && p.deltas[n-1].Index == index {
		p.deltas[n-1].Arguments += frag
		return
	}
	p.deltas = append(p.deltas, Delta{Index: index, Arguments: frag})
}

// finishCall records the completed call and drops its text.
func (p *Parser) finishCall() {
	cs := p.call
	var args string
	switch {
	case cs.argsOnly:
		args = string(p.held[cs.objOff : cs.objOff+cs.scan.n])
		cs.argsEnd = cs.scan.n
		p.flushCallArgs(cs)
	case cs.argsStart < 0:
		args = "{}"
		p.emitArgs(cs.index, args)
	case cs.argsString:
		args = cs.argsText
		p.emitArgs(cs.index, args)
	default:
		args = string(p.held[cs.objOff+cs.argsStart : cs.objOff+cs.argsEnd])
		p.flushCallArgs(cs)
	}
	p.calls = append(p.calls, Call{Name: cs.name, Arguments: args})
	p.callIdx = append(p.callIdx, cs.index)
	p.drop(cs.objOff + cs.scan.n)
	p.call = nil
	p.grpCalls++
	switch {
	case p.format == Llama3:
		p.st = stLlamaNext
	case p.format == Mistral && cs.inList:
		p.st = stMistralNext
	case p.format == Mistral:
		p.st = stContent
		p.afterCall = true
	default:
		p.st = stAfterObj
		p.tagPos = 0
	}
}

// abandon forgets the call being read; its index, if it had one, is not
// reused.
func (p *Parser) abandon() { p.call = nil }

func isNameByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.'
}

func isJSONObject(s string) bool {
	t := bytes.TrimLeft([]byte(s), " \t\r\n")
	return len(t) > 0 && t[0] == '{' && json.Valid(t)
}
