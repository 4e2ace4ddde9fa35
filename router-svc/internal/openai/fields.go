package openai

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strconv"
	"strings"
)

// Strict request checking (issue 20): a field Baton does not know is
// refused, as OpenAI refuses it, rather than silently ignored — a typo such
// as max_token would otherwise run with the default length, and a feature
// Baton lacks would seem to work. The known fields are the JSON names of the
// request structs' fields (request.go), so the list cannot drift from what is
// decoded; objects Baton reads inside a request (stream_options,
// response_format, response_format.json_schema, messages[i]) are checked the
// same way, and so are the objects Baton reads from raw JSON (tools[i] and
// their function, tool_choice, an assistant message's tool_calls, content
// parts): a field tagged fields:"NAME" is checked against fieldShapes[NAME].
// A JSON schema (parameters, json_schema.schema) is not: its keywords are
// the schema compiler's to judge.

// unrecognized is OpenAI's answer for an unknown field (OpenAI itself sends
// param null; Baton names the field).
func unrecognized(path string) *httpError {
	return invalid(path, "Unrecognized request argument supplied: %s", path)
}

// fieldShapes are the known keys of the objects the request structs hold
// as raw JSON (their fields' tag fields:"NAME"), as structs whose JSON
// names are those keys. Keys Baton reads only to refuse their values
// (image_url, custom) are here so that the refusal says why.
var fieldShapes = map[string]reflect.Type{
	"tool": reflect.TypeFor[struct {
		Type     string          `json:"type"`
		Custom   json.RawMessage `json:"custom"`
		Function *struct {
			Name        string          `json:"name"`
			Description string          `json:"description"`
			Parameters  json.RawMessage `json:"parameters"`
			Strict      json.RawMessage `json:"strict"`
		} `json:"function"`
	}](),
	"tool_choice": reflect.TypeFor[struct {
		Type     string `json:"type"`
		Function *struct {
			Name string `json:"name"`
		} `json:"function"`
	}](),
	"tool_call": reflect.TypeFor[struct {
		ID   string `json:"id"`
		Type string `json:"type"`
		// Index is what a call's stream deltas carry; clients that put
		// a streamed reply back together send it back.
		Index    json.RawMessage `json:"index"`
		Function *struct {
			Name      string          `json:"name"`
			Arguments json.RawMessage `json:"arguments"`
		} `json:"function"`
	}](),
	"content_part": reflect.TypeFor[struct {
		Type       string          `json:"type"`
		Text       json.RawMessage `json:"text"`
		ImageURL   json.RawMessage `json:"image_url"`
		InputAudio json.RawMessage `json:"input_audio"`
		File       json.RawMessage `json:"file"`
		Refusal    json.RawMessage `json:"refusal"`
	}](),
}

// knownFields maps each struct type the requests contain to its fields' JSON
// names and, for each, the struct type checked inside it (nil for none).
// It is filled once, for the request types, and only read afterwards.
var knownFields = func() map[reflect.Type]map[string]reflect.Type {
	m := map[reflect.Type]map[string]reflect.Type{}
	addFields(m, reflect.TypeFor[completionRequest]())
	addFields(m, reflect.TypeFor[chatRequest]())
	return m
}()

// structOf is the struct type a field's value is checked against: the
// field's own struct type, or its element's for a pointer, slice or array.
func structOf(t reflect.Type) reflect.Type {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Array {
		if t == reflect.TypeFor[json.RawMessage]() {
			return nil
		}
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return nil
	}
	return t
}

func addFields(m map[reflect.Type]map[string]reflect.Type, t reflect.Type) {
	if _, ok := m[t]; ok {
		return
	}
	names := map[string]reflect.Type{}
	m[t] = names
	var walk func(t reflect.Type)
	walk = func(t reflect.Type) {
		for f := range t.Fields() {
			if f.Anonymous && f.Type.Kind() == reflect.Struct {
				walk(f.Type) // embedded: its fields are the outer object's
				continue
			}
			if !f.IsExported() {
				continue
			}
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "-" {
				continue
			}
			if name == "" {
				name = f.Name
			}
			inner := structOf(f.Type)
			if shape := f.Tag.Get("fields"); shape != "" {
				inner = fieldShapes[shape]
			}
			names[name] = inner
			if inner != nil {
				addFields(m, inner)
			}
		}
	}
	walk(t)
}

// unknownFields reports the path (stream_options.foo, messages[2].weight) of
// each field of raw, a JSON value decoded into a t, that t does not have, in
// the order they appear, until report returns false.
func unknownFields(raw []byte, t reflect.Type, path string, report func(path string) bool) bool {
	switch raw = bytes.TrimSpace(raw); {
	case len(raw) == 0:
		return true
	case raw[0] == '[':
		var list []json.RawMessage
		if json.Unmarshal(raw, &list) != nil {
			return true
		}
		for i, v := range list {
			if !unknownFields(v, t, path+"["+strconv.Itoa(i)+"]", report) {
				return false
			}
		}
		return true
	case raw[0] != '{':
		return true
	}
	names := knownFields[t]
	dec := json.NewDecoder(bytes.NewReader(raw))
	if _, err := dec.Token(); err != nil {
		return true
	}
	prefix := path
	if prefix != "" {
		prefix += "."
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return true
		}
		key, _ := tok.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return true
		}
		inner, ok := names[key]
		switch {
		case !ok:
			if !report(prefix + key) {
				return false
			}
		case inner != nil:
			if !unknownFields(v, inner, prefix+key, report) {
				return false
			}
		}
	}
	return true
}

// checkFields refuses the first unknown field of body, a request decoded
// into v; in lenient mode it returns the unknown fields' paths instead, for
// the caller to log.
func checkFields(body []byte, v any, lenient bool) ([]string, *httpError) {
	t := reflect.TypeOf(v)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	var found []string
	unknownFields(body, t, "", func(path string) bool {
		found = append(found, path)
		return lenient
	})
	if len(found) > 0 && !lenient {
		return nil, unrecognized(found[0])
	}
	return found, nil
}

// withoutUnknown is raw, a JSON value decoded into a t, less the fields t
// does not have, at every depth unknownFields checks: what a lenient
// request is decoded from, so that a key that differs from a known one
// only in case ("Max_Tokens") is ignored, as the log says, rather than
// honoured by encoding/json's case-insensitive matching. A value that is
// not well-formed JSON is returned as it is (decoding reports it).
func withoutUnknown(raw []byte, t reflect.Type) []byte {
	trimmed := bytes.TrimSpace(raw)
	switch {
	case len(trimmed) == 0:
		return raw
	case trimmed[0] == '[':
		var list []json.RawMessage
		if json.Unmarshal(trimmed, &list) != nil {
			return raw
		}
		var b bytes.Buffer
		b.WriteByte('[')
		for i, v := range list {
			if i > 0 {
				b.WriteByte(',')
			}
			b.Write(withoutUnknown(v, t))
		}
		b.WriteByte(']')
		return b.Bytes()
	case trimmed[0] != '{':
		return raw
	}
	names := knownFields[t]
	dec := json.NewDecoder(bytes.NewReader(trimmed))
	if _, err := dec.Token(); err != nil {
		return raw
	}
	var b bytes.Buffer
	b.WriteByte('{')
	n := 0
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return raw
		}
		key, _ := tok.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return raw
		}
		inner, ok := names[key]
		if !ok {
			continue
		}
		if inner != nil {
			v = withoutUnknown(v, inner)
		}
		if n > 0 {
			b.WriteByte(',')
		}
		n++
		k, _ := json.Marshal(key)
		b.Write(k)
		b.WriteByte(':')
		b.Write(v)
	}
	b.WriteByte('}')
	return b.Bytes()
}
