package openai

// n > 1: one request's choices, each rendered by a format of its own (the
// text offsets, the echoed prompt, a tool-call parser are per choice), their
// chunks interleaved by index as the workers' events come, as OpenAI
// streams them.

import (
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"google.golang.org/protobuf/proto"
)

// formats returns the format of j's response: mk's for one choice, or one
// of mk's per choice.
func (j *job) formats(mk func() format) format {
	if j.n <= 1 {
		return mk()
	}
	m := &multiFormat{j: j, subs: make([]format, j.n), begun: make([]bool, j.n)}
	for k := range m.subs {
		m.subs[k] = mk()
	}
	return m
}

// multiFormat renders the choices of a request with n > 1.
type multiFormat struct {
	j    *job
	subs []format
	// promptLogprobs (echo) come on one event, of whichever choice the
	// workers put them on; every choice's echo shows them.
	promptLogprobs []*batonv1.TokenLogprob
	begun          []bool // a choice has been given the prompt's logprobs
}

// withIndex sets the choice index k on a response object's choices.
func withIndex(obj any, k int) any {
	switch o := obj.(type) {
	case *completionObject:
		for i := range o.Choices {
			o.Choices[i].Index = k
		}
	case *chatObject:
		for i := range o.Choices {
			o.Choices[i].Index = k
		}
	}
	return obj
}

func (m *multiFormat) whole(o *output) any {
	var whole any
	for k, f := range m.subs {
		sub := o.choices[k]
		sub.promptLogprobs = o.promptLogprobs
		obj := withIndex(f.whole(sub), k)
		switch v := obj.(type) {
		case *completionObject:
			if whole == nil {
				whole = v
			} else {
				w := whole.(*completionObject)
				w.Choices = append(w.Choices, v.Choices...)
			}
		case *chatObject:
			if whole == nil {
				whole = v
			} else {
				w := whole.(*chatObject)
				w.Choices = append(w.Choices, v.Choices...)
			}
		}
	}
	// The request's usage: the prompt once, every choice's tokens.
	u := o.usage(m.j.req)
	switch w := whole.(type) {
	case *completionObject:
		w.Usage = m.subs[0].(*completionFormat).usageOf(u)
	case *chatObject:
		w.Usage = u
	}
	return whole
}

func (m *multiFormat) opening() []any {
	var out []any
	for k, f := range m.subs {
		for _, c := range f.opening() {
			out = append(out, withIndex(c, k))
		}
	}
	return out
}

func (m *multiFormat) chunks(ev *batonv1.GenerateEvent) []any {
	k := int(ev.GetIndex())
	if k >= len(m.subs) {
		return nil // the Generator's bug; the choices that exist go on
	}
	if lps := ev.GetPromptLogprobs(); len(lps) > 0 {
		m.promptLogprobs = lps
	}
	if !m.begun[k] && len(m.promptLogprobs) > 0 {
		// The choice's first event with the prompt's logprobs, its own or
		// another choice's.
		m.begun[k] = true
		if len(ev.GetPromptLogprobs()) == 0 {
			ev = proto.Clone(ev).(*batonv1.GenerateEvent)
			ev.PromptLogprobs = m.promptLogprobs
		}
	}
	out := m.subs[k].chunks(ev)
	for _, c := range out {
		withIndex(c, k)
	}
	return out
}

func (m *multiFormat) usage(u *usageObject) any { return m.subs[0].usage(u) }
