package openai

import (
	"strings"

	"github.com/baton-serving/baton/engine/tokenizer"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"google.golang.org/protobuf/proto"
)

// Mistral's tool-call markers [TOOL_CALLS] and [ARGS] are control tokens:
// the workers' text, like every detokenizer's default, leaves them out, so
// the [TOOL_CALLS]name[ARGS]{...} form would read get_time{...}. When a
// request's output is parsed for calls, the router puts the markers back
// into the text it parses, where their ids are in the event.

// markerIDs are the ids of the family's marker tokens that the model's
// vocabulary holds as control tokens, with their text; nil when none.
func markerIDs(tok *tokenizer.Tokenizer, fam toolFamily) map[uint32]string {
	if fam != familyMistral || tok == nil {
		return nil
	}
	var out map[uint32]string
	for _, m := range []string{mistralMark, mistralArgs} {
		ids := tok.Encode(m, tokenizer.EncodeOptions{ParseSpecial: true})
		if len(ids) == 1 && tok.TokenBytes(ids[0]) == nil && tok.Piece(ids[0]) == m {
			if out == nil {
				out = map[uint32]string{}
			}
			out[uint32(ids[0])] = m
		}
	}
	return out
}

// withMarkers is ev with the job's marker tokens' text put into its text
// at their places (the bytes of the tokens before each); ev itself when it
// holds none (the worker's event is never changed).
func (j *job) withMarkers(tok *tokenizer.Tokenizer, ev *batonv1.GenerateEvent) *batonv1.GenerateEvent {
	if len(j.markers) == 0 {
		return ev
	}
	ids := ev.GetTokenIds()
	found := false
	for _, id := range ids {
		if _, ok := j.markers[id]; ok {
			found = true
			break
		}
	}
	if !found {
		return ev
	}
	text := ev.GetText()
	var b strings.Builder
	pos, written := 0, 0
	for _, id := range ids {
		if m, ok := j.markers[id]; ok {
			cut := max(min(pos, len(text)), written)
			b.WriteString(text[written:cut])
			b.WriteString(m)
			written = cut
			continue
		}
		pos += len(tok.TokenBytes(int32(min(id, 1<<31-1))))
	}
	b.WriteString(text[written:])
	out := proto.Clone(ev).(*batonv1.GenerateEvent)
	out.Text = b.String()
	return out
}
