package openai

import "strings"

// toolStream splits a streamed output into content, sent as it comes, and
// tool calls. Text that may be the start of a call is held back, as a stop
// string's prefix is. For the Hermes family that is a suffix that is a
// prefix of <tool_call> (and the whitespace before it); after the marker,
// each call goes out as its block closes. For the JSON families it is an
// output whose first non-space character opens JSON (or a marker): all of
// it, until the end shows whether it parses. What it sends is what the
// whole output parses to (parseToolCalls).
type toolStream struct {
	ts   *toolSetup
	held string // text not yet sent
	// calling: the held text is a call (or may be one).
	calling bool
	// plain: the output holds no call; the rest is content.
	plain bool
	// done: the calls have ended in a malformed block; the rest is
	// dropped (Hermes), and kept in dropped for the log.
	done    bool
	dropped string
	calls   int  // calls parsed
	sent    bool // content sent before the calls (Hermes)
	// scanned counts the bytes of held read in search of a block's end
	// (a test's measure of the work per push).
	scanned int
	// open: held starts (after space) with an unclosed <tool_call> block
	// whose first open bytes hold no </tool_call>, so a push searches for
	// the end only in what it added.
	open int
}

func newToolStream(ts *toolSetup) *toolStream { return &toolStream{ts: ts} }

// push takes the next piece of output and returns the content and the
// calls to send now.
func (s *toolStream) push(text string) (string, []parsedCall) {
	switch {
	case s.plain:
		return text, nil
	case s.done:
		s.dropped += text
		return "", nil
	}
	s.held += text
	if s.ts.family == familyHermes {
		if !s.calling {
			i := strings.Index(s.held, hermesOpen)
			if i < 0 {
				keep := markerPrefixLen(s.held, hermesOpen)
				body := s.held[:len(s.held)-keep]
				keep += len(body) - len(strings.TrimRight(body, " \t\r\n"))
				out := s.held[:len(s.held)-keep]
				s.held = s.held[len(s.held)-keep:]
				s.sent = s.sent || out != ""
				return out, nil
			}
			// The whitespace before the call stays held: dropped if
			// the call parses, content if it does not.
			out := strings.TrimRight(s.held[:i], " \t\r\n")
			s.held, s.calling = s.held[len(out):], true
			s.sent = s.sent || out != ""
			content, calls := s.hermes(false)
			return out + content, calls
		}
		return s.hermes(false)
	}
	if s.calling {
		return "", nil
	}
	t := strings.TrimLeft(s.held, " \t\r\n")
	switch {
	case t == "":
		return "", nil
	case t[0] == '{' || t[0] == '[' || strings.HasPrefix(t, llamaPyTag):
		s.calling = true
		return "", nil
	case strings.HasPrefix(llamaPyTag, t):
		return "", nil // may still become the tag
	}
	out := s.held
	s.held, s.plain = "", true
	return out, nil
}

// hermes reads the held <tool_call> blocks (final: the output has ended),
// as parseHermes reads them: the content after the calls, and the calls
// (only the first with parallel_tool_calls false).
func (s *toolStream) hermes(final bool) (string, []parsedCall) {
	var calls []parsedCall
	for !s.done && !s.plain {
		if s.calls < maxToolCalls {
			if s.open > 0 && !final {
				from := max(0, s.open-len(hermesClose)+1)
				s.scanned += len(s.held) - from
				if !strings.Contains(s.held[from:], hermesClose) {
					s.open = len(s.held)
					return "", calls // the block is still open
				}
			}
			s.scanned += len(s.held)
			c, rest, st := hermesNext(s.held, s.ts.declared, final)
			s.open = 0
			switch st {
			case hermesCall:
				if !s.ts.single || s.calls == 0 {
					calls = append(calls, c)
				}
				s.calls++
				s.held = rest
				continue
			case hermesMore:
				if strings.HasPrefix(strings.TrimLeft(s.held, " \t\r\n"), hermesOpen) {
					s.open = len(s.held)
				}
				return "", calls
			}
			if s.calls == 0 {
				// The first block holds no call: the output is content.
				out := s.held
				s.held, s.plain = "", true
				return out, nil
			}
		}
		after, dropped := hermesAfter(s.held, s.calls == maxToolCalls)
		s.held = ""
		if dropped != "" || s.calls == maxToolCalls {
			s.done, s.dropped = true, dropped
			break
		}
		// Content after the calls: the rest of the output is content.
		s.plain = true
		if after != "" && s.sent {
			after = "\n" + after
		}
		return after, calls
	}
	return "", calls
}

// markerPrefixLen is the length of the longest suffix of s that is a proper
// prefix of marker.
func markerPrefixLen(s, marker string) int {
	for n := min(len(s), len(marker)-1); n > 0; n-- {
		if strings.HasSuffix(s, marker[:n]) {
			return n
		}
	}
	return 0
}

// finish ends the output: the content still to send and the calls.
func (s *toolStream) finish() (string, []parsedCall) {
	switch {
	case s.plain || !s.calling:
		held := s.held
		s.held = ""
		return held, nil
	case s.ts.family == familyHermes:
		return s.hermes(true)
	}
	held := s.held
	s.held = ""
	content, calls, ok := parseToolCalls(s.ts.family, held, s.ts.declared)
	if !ok {
		return held, nil
	}
	return content, s.ts.limit(calls)
}

// forcedStream streams the calls of a forced reply (tool_choice required
// or a named function) as they are generated, as OpenAI does: the grammar
// fixes their syntax — {"name": "<name>", "<arguments|parameters>": <object>}
// inside the family's wrapping — so a call's first delta (index, id, type,
// name) goes out once its name is complete, and its arguments in fragments
// as they come. The fragments of a call put together are the arguments the
// whole reply would carry.
type forcedStream struct {
	ts    *toolSetup
	text  string // everything so far
	pos   int    // how far text has been read
	state int    // forcedSeek, forcedName, forcedKey, forcedArgs
	name  string
	calls int // calls begun
	// In the arguments: nesting depth, and inside a string (esc: after a
	// backslash).
	depth     int
	inStr     bool
	esc       bool
	complete  bool // the last call begun is complete
	fragStart int
}

const (
	forcedSeek = iota
	forcedName
	forcedKey
	forcedArgs
)

const callOpen = `{"name": "`

// push takes the next piece of output and returns the deltas it completes.
func (s *forcedStream) push(text string) []toolCallDelta {
	s.text += text
	var out []toolCallDelta
	for {
		switch s.state {
		case forcedSeek:
			i := strings.Index(s.text[s.pos:], callOpen)
			if i < 0 || s.calls == maxToolCalls {
				return out
			}
			s.pos += i + len(callOpen)
			s.state = forcedName
		case forcedName:
			i := strings.IndexByte(s.text[s.pos:], '"')
			if i < 0 {
				return out
			}
			s.name = s.text[s.pos : s.pos+i]
			s.pos += i + 1
			s.state = forcedKey
		case forcedKey:
			rest := s.text[s.pos:]
			key := ""
			for _, k := range []string{`, "arguments": `, `, "parameters": `} {
				if strings.HasPrefix(rest, k) {
					key = k
				} else if strings.HasPrefix(k, rest) {
					return out // not all there yet
				}
			}
			if key == "" {
				s.state = forcedSeek // not a call after all
				continue
			}
			s.pos += len(key)
			out = append(out, toolCallDelta{Index: s.calls, ID: callID(s.ts.family), Type: "function", Function: functionCall{Name: s.name}})
			s.calls++
			s.state, s.depth, s.inStr, s.esc, s.complete, s.fragStart = forcedArgs, 0, false, false, false, s.pos
		case forcedArgs:
			end := -1
			for i := s.pos; i < len(s.text) && end < 0; i++ {
				c := s.text[i]
				switch {
				case s.esc:
					s.esc = false
				case s.inStr && c == '\\':
					s.esc = true
				case s.inStr:
					s.inStr = c != '"'
				case c == '"':
					s.inStr = true
				case c == '{' || c == '[':
					s.depth++
				case c == '}' || c == ']':
					s.depth--
				}
				if s.depth == 0 && !s.inStr && c != ' ' && c != '\n' && c != '\t' && c != '\r' {
					end = i + 1
				}
			}
			if end < 0 {
				s.pos = len(s.text)
				if s.pos > s.fragStart {
					out = append(out, toolCallDelta{Index: s.calls - 1, Function: functionCall{Arguments: s.text[s.fragStart:s.pos]}})
					s.fragStart = s.pos
				}
				return out
			}
			s.pos = end
			out = append(out, toolCallDelta{Index: s.calls - 1, Function: functionCall{Arguments: s.text[s.fragStart:end]}})
			s.state, s.complete = forcedSeek, true
		}
	}
}

// finish ends the reply: the calls begun, and whether the last is
// complete. A reply in which no call began (a worker that did not follow
// the grammar) is read as tool_choice auto would read it: content, or the
// calls it holds.
func (s *forcedStream) finish() (content string, deltas []toolCallDelta, calls int, complete bool) {
	if s.calls > 0 {
		return "", nil, s.calls, s.complete
	}
	c, parsed, _ := s.ts.parse(s.text)
	if len(parsed) == 0 {
		return s.text, nil, 0, true
	}
	if c != nil {
		content = *c
	}
	for i, p := range parsed {
		deltas = append(deltas, toolCallDelta{Index: i, ID: callID(s.ts.family), Type: "function", Function: functionCall{Name: p.Name}},
			toolCallDelta{Index: i, Function: functionCall{Arguments: p.Arguments}})
	}
	return content, deltas, len(parsed), true
}
