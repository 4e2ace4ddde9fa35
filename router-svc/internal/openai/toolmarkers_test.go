package openai

import (
	"testing"

	"github.com/baton-serving/baton/engine/tokenizer"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
)

// TestMistralMarkersRestored: Mistral's [TOOL_CALLS] and [ARGS] are control
// tokens, which the workers' text leaves out; with tools the parser reads
// the text with them put back where their ids are, so that the
// [TOOL_CALLS]name[ARGS]{...} form parses, whole and streamed.
func TestMistralMarkersRestored(t *testing.T) {
	eg := storiesTokenizer(t)
	enc := func(s string) []uint32 { return wireIDs(eg.Encode(s, tokenizer.EncodeOptions{})) }
	const callsID, argsID = 1 << 20, 1<<20 + 1 // ids no text has
	j := &job{markers: map[uint32]string{callsID: mistralMark, argsID: mistralArgs}}
	name, args := enc("get_time"), enc(`{"tz":"CET"}`)
	ids := append(append(append([]uint32{callsID}, name...), argsID), args...)
	var text []byte
	for _, id := range ids {
		text = append(text, eg.TokenBytes(int32(id))...)
	}
	ev := &batonv1.GenerateEvent{TokenIds: ids, Text: string(text)}
	got := j.withMarkers(eg, ev).GetText()
	if got != `[TOOL_CALLS] get_time[ARGS] {"tz":"CET"}` { // SentencePiece: each text starts with a space
		t.Fatalf("text %q", got)
	}
	if ev.GetText() == got {
		t.Error("the worker's event was changed in place")
	}
	ts := &toolSetup{family: familyMistral, choice: "auto", tools: []ToolDef{{Name: "get_time"}}}
	if _, calls, _ := ts.parse(got); len(calls) != 1 || calls[0].Name != "get_time" {
		t.Errorf("calls %+v", calls)
	}
	// One token an event, as workers stream them.
	s := newToolStream(ts)
	var n int
	for _, id := range ids {
		e := &batonv1.GenerateEvent{TokenIds: []uint32{id}, Text: string(eg.TokenBytes(int32(id)))}
		_, cs := s.push(j.withMarkers(eg, e).GetText())
		n += len(cs)
	}
	_, cs := s.finish()
	if n+len(cs) != 1 {
		t.Errorf("streamed: %d calls", n+len(cs))
	}
}
