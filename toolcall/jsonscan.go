package toolcall

// jscan is an incremental JSON syntax checker for one object, fed a byte at
// a time. It accepts exactly the JSON grammar (RFC 8259) except that it does
// not check the UTF-8 encoding of strings, and it limits nesting to maxDepth.
// Besides checking, it reports the members of the outermost object: where
// each key and each value starts and ends, so that a call's name and
// arguments can be picked out while the object is still arriving.
type jscan struct {
	stack []byte // open containers, '{' or '['
	st    jstate
	lit   string // rest of a literal (true, false, null) being matched
	hexN  int    // hex digits still expected in a \u escape
	key   bool   // the string being scanned is an object key

	// Members of the outermost object, as byte offsets into the fed text
	// (offset = number of bytes fed before the byte).
	keyStart, keyEnd int // last member key, quotes included; end exclusive
	valStart         int // start of the member value being scanned, or -1
	lastValEnd       int // end (exclusive) of the member value that just ended
	n                int // bytes fed so far
}

type jstate uint8

const (
	jsValue    jstate = iota // expecting a value
	jsObjFirst               // after '{': key or '}'
	jsObjKey                 // after ',' in an object: key
	jsColon                  // after a key: ':'
	jsObjNext                // after a member value: ',' or '}'
	jsArrFirst               // after '[': value or ']'
	jsArrNext                // after an element: ',' or ']'
	jsStr                    // inside a string
	jsEsc                    // after '\' in a string
	jsHex                    // inside \uXXXX
	jsMinus                  // after '-'
	jsZero                   // after a leading '0'
	jsInt                    // in integer digits
	jsDot                    // after '.'
	jsFrac                   // in fraction digits
	jsE                      // after 'e'
	jsESign                  // after 'e+' / 'e-'
	jsExp                    // in exponent digits
	jsLit                    // in true/false/null
	jsDone                   // the object is complete
	jsErr                    // syntax error
)

// maxDepth bounds JSON nesting inside a call.
const maxDepth = 128

// jev is what one byte did to the outermost object.
type jev uint8

const (
	evNone     jev = iota
	evKeyEnd       // a member key ended with this byte (keyStart..keyEnd)
	evValStart     // a member value starts with this byte (valStart)
	evValEnd       // a member value ended; end offset in valEnd()
	evDone         // the outermost object ended with this byte
)

func newJScan() *jscan { return &jscan{st: jsValue, valStart: -1} }

func isWS(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func (s *jscan) done() bool   { return s.st == jsDone }
func (s *jscan) failed() bool { return s.st == jsErr }

// takeMember returns the span of the member value that just ended (after
// evValEnd) and forgets it.
func (s *jscan) takeMember() (start, end int) {
	start, end = s.valStart, s.lastValEnd
	s.valStart = -1
	return start, end
}

// feed scans byte c and returns what it did to the outermost object. A
// number value that ends reports evValEnd with the byte after it (its end
// is then the offset of that byte); a byte can therefore end one member
// value and do nothing else, as numbers are followed by ',' or '}' (which
// never start anything). After an error or the end of the object, feed
// does nothing and returns evNone. The end of the object is reported as
// evDone, except when the byte also ended a number (then evValEnd; check
// done()).
func (s *jscan) feed(c byte) jev {
	if s.st == jsDone || s.st == jsErr {
		return evNone
	}
	ev := s.step(c)
	s.n++
	return ev
}

func (s *jscan) fail() jev { s.st = jsErr; return evNone }

// topMember reports whether the innermost open container is the outermost
// object, that is whether a value starting now is a member of it.
func (s *jscan) topMember() bool { return len(s.stack) == 1 }

// step scans byte c in the current state (one method per kind of state).
func (s *jscan) step(c byte) jev {
	switch s.st {
	case jsValue:
		return s.stepValue(c)
	case jsObjFirst, jsObjKey, jsColon, jsObjNext:
		return s.stepObject(c)
	case jsArrFirst, jsArrNext:
		return s.stepArray(c)
	case jsStr, jsEsc, jsHex:
		return s.stepString(c)
	case jsMinus, jsDot, jsE, jsESign:
		return s.stepNumberPart(c)
	case jsZero, jsInt, jsFrac, jsExp:
		return s.stepNumber(c)
	case jsLit:
		if c != s.lit[0] {
			return s.fail()
		}
		s.lit = s.lit[1:]
		if s.lit == "" {
			return s.endValue(s.n + 1)
		}
		return evNone
	}
	return s.fail()
}

// stepValue expects white space, then a value (the outermost: an object).
func (s *jscan) stepValue(c byte) jev {
	if isWS(c) {
		return evNone
	}
	if len(s.stack) == 0 && c != '{' {
		return s.fail() // the outermost value must be an object
	}
	var ev jev
	if s.topMember() && s.stack[0] == '{' {
		s.valStart = s.n
		ev = evValStart
	}
	if !s.beginValue(c) {
		return s.fail()
	}
	return ev
}

// stepObject scans the syntax of an object between its values: keys'
// opening quotes, ':', ',' and '}'.
func (s *jscan) stepObject(c byte) jev {
	if isWS(c) {
		return evNone
	}
	switch s.st {
	case jsObjFirst, jsObjKey:
		if c == '"' {
			s.st, s.key = jsStr, true
			if len(s.stack) == 1 {
				s.keyStart = s.n
			}
			return evNone
		}
		if c == '}' && s.st == jsObjFirst {
			return s.closeContainer()
		}
	case jsColon:
		if c == ':' {
			s.st = jsValue
			return evNone
		}
	case jsObjNext:
		switch c {
		case ',':
			s.st = jsObjKey
			return evNone
		case '}':
			return s.closeContainer()
		}
	}
	return s.fail()
}

// stepArray scans the syntax of an array between its values: ',' and ']'
// (and its first value).
func (s *jscan) stepArray(c byte) jev {
	if isWS(c) {
		return evNone
	}
	if s.st == jsArrFirst {
		if c == ']' {
			return s.closeContainer()
		}
		if !s.beginValue(c) {
			return s.fail()
		}
		return evNone
	}
	switch c {
	case ',':
		s.st = jsValue
		return evNone
	case ']':
		return s.closeContainer()
	}
	return s.fail()
}

// stepString scans a string (a key or a value) and its escapes.
func (s *jscan) stepString(c byte) jev {
	switch s.st {
	case jsStr:
		switch {
		case c == '"':
			if s.key {
				s.key = false
				s.st = jsColon
				if len(s.stack) == 1 {
					s.keyEnd = s.n + 1
					return evKeyEnd
				}
				return evNone
			}
			return s.endValue(s.n + 1)
		case c == '\\':
			s.st = jsEsc
		case c < 0x20:
			return s.fail()
		}
	case jsEsc:
		switch c {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			s.st = jsStr
		case 'u':
			s.st, s.hexN = jsHex, 4
		default:
			return s.fail()
		}
	case jsHex:
		if !isHex(c) {
			return s.fail()
		}
		s.hexN--
		if s.hexN == 0 {
			s.st = jsStr
		}
	}
	return evNone
}

// stepNumberPart scans the bytes of a number after which it cannot end:
// after '-', '.', 'e' and the exponent's sign.
func (s *jscan) stepNumberPart(c byte) jev {
	digit := c >= '0' && c <= '9'
	switch {
	case s.st == jsMinus && c == '0':
		s.st = jsZero
	case s.st == jsMinus && digit:
		s.st = jsInt
	case s.st == jsDot && digit:
		s.st = jsFrac
	case s.st == jsE && (c == '+' || c == '-'):
		s.st = jsESign
	case (s.st == jsE || s.st == jsESign) && digit:
		s.st = jsExp
	default:
		return s.fail()
	}
	return evNone
}

// stepNumber scans a byte after a number's digits: more of the number, or
// the byte after its end.
func (s *jscan) stepNumber(c byte) jev {
	switch {
	case c >= '0' && c <= '9' && s.st != jsZero:
		return evNone
	case c == '.' && (s.st == jsZero || s.st == jsInt):
		s.st = jsDot
		return evNone
	case (c == 'e' || c == 'E') && s.st != jsExp:
		s.st = jsE
		return evNone
	}
	// The number ended before c; c must now be a separator.
	ev := s.endValue(s.n)
	if s.st == jsDone { // cannot happen: the outermost value is an object
		return s.fail()
	}
	ev2 := s.step(c)
	if ev == evNone || s.st == jsErr {
		return ev2
	}
	return ev // ev2 is then evNone or evDone (see done())
}

// beginValue starts a value with its first byte c.
func (s *jscan) beginValue(c byte) bool {
	switch {
	case c == '{' || c == '[':
		if len(s.stack) >= maxDepth {
			return false
		}
		s.stack = append(s.stack, c)
		if c == '{' {
			s.st = jsObjFirst
		} else {
			s.st = jsArrFirst
		}
	case c == '"':
		s.st, s.key = jsStr, false
	case c == '-':
		s.st = jsMinus
	case c == '0':
		s.st = jsZero
	case c >= '1' && c <= '9':
		s.st = jsInt
	case c == 't':
		s.st, s.lit = jsLit, "rue"
	case c == 'f':
		s.st, s.lit = jsLit, "alse"
	case c == 'n':
		s.st, s.lit = jsLit, "ull"
	default:
		return false
	}
	return true
}

// closeContainer closes the innermost container with the current byte.
func (s *jscan) closeContainer() jev {
	s.stack = s.stack[:len(s.stack)-1]
	if len(s.stack) == 0 {
		s.st = jsDone
		return evDone
	}
	return s.endValue(s.n + 1)
}

// endValue records that a value ended at offset end (exclusive) and moves to
// what may follow it in its container.
func (s *jscan) endValue(end int) jev {
	if len(s.stack) == 0 {
		s.st = jsDone
		return evDone
	}
	if s.stack[len(s.stack)-1] == '{' {
		s.st = jsObjNext
	} else {
		s.st = jsArrNext
	}
	if len(s.stack) == 1 && s.valStart >= 0 {
		s.lastValEnd = end
		return evValEnd
	}
	return evNone
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}
