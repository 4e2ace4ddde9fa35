package openai

import (
	"encoding/json"
	"math"
	"regexp"
	"slices"
	"strconv"

	"github.com/baton-serving/baton/engine/sample"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/svckit/apiconv"
)

// Bounds of the fields checked here, as OpenAI documents them.
const (
	maxLogitBias = apiconv.MaxLogitBias
	maxBias      = sample.MaxLogitBias
	// metadata: at most 16 pairs, keys up to 64 characters, values up to 512.
	maxMetadataPairs = 16
	maxMetadataKey   = 64
	maxMetadataValue = 512
)

// schemaName is what OpenAI accepts as response_format.json_schema.name.
var schemaName = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)

// parseLogitBias reads logit_bias: an object whose keys are token ids
// written as strings (OpenAI's form) and whose values are biases in
// [-100, 100]. Every fault names logit_bias.
func (h *Handler) parseLogitBias(raw json.RawMessage) (map[uint32]float32, *httpError) {
	if isNull(raw) {
		return nil, nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, invalid("logit_bias", "logit_bias: expected an object mapping token ids (as strings) to biases in [-%d, %d]", maxBias, maxBias)
	}
	if len(m) > maxLogitBias {
		return nil, invalid("logit_bias", "logit_bias: %d entries; at most %d are allowed", len(m), maxLogitBias)
	}
	vocab := uint64(h.model.Tokenizer.VocabSize())
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys) // the same request always names the same fault
	out := make(map[uint32]float32, len(m))
	for _, k := range keys {
		id, err := strconv.ParseUint(k, 10, 32)
		if err != nil {
			return nil, invalid("logit_bias", "logit_bias: key %q is not a token id (a non-negative integer written as a string)", k)
		}
		if id >= vocab {
			return nil, invalid("logit_bias", "logit_bias: token id %d is beyond the vocabulary (ids 0-%d)", id, vocab-1)
		}
		var b float64
		if err := json.Unmarshal(m[k], &b); err != nil {
			return nil, invalid("logit_bias", "logit_bias[%q]: expected a number in [-%d, %d]", k, maxBias, maxBias)
		}
		if math.IsNaN(b) || b < -maxBias || b > maxBias {
			return nil, invalid("logit_bias", "logit_bias[%q] = %g: want a value in [-%d, %d]", k, b, maxBias, maxBias)
		}
		out[uint32(id)] = float32(b)
	}
	return out, nil
}

// chatExtras checks the chat fields clients commonly send that ask for
// nothing Baton does, refusing the values that ask for what it lacks.
func chatExtras(in *chatRequest) *httpError {
	if !isNull(in.Metadata) {
		var m map[string]string
		if err := json.Unmarshal(in.Metadata, &m); err != nil {
			return invalid("metadata", "metadata: expected an object of string values")
		}
		if len(m) > maxMetadataPairs {
			return invalid("metadata", "metadata: %d pairs; at most %d are allowed", len(m), maxMetadataPairs)
		}
		for k, v := range m {
			if len(k) > maxMetadataKey || len(v) > maxMetadataValue {
				return invalid("metadata", "metadata[%q]: keys may have at most %d characters and values %d", k, maxMetadataKey, maxMetadataValue)
			}
		}
	}
	if in.Store != nil && *in.Store {
		return invalid("store", "store: true is not supported: Baton does not store completions")
	}
	if t := in.ServiceTier; t != nil && *t != "auto" && *t != "default" {
		return invalid("service_tier", "service_tier %q is not offered: want \"auto\" or \"default\"", *t)
	}
	if !isNull(in.Modalities) {
		var list []string
		if err := json.Unmarshal(in.Modalities, &list); err != nil {
			return invalid("modalities", "modalities: expected an array of strings")
		}
		for _, m := range list {
			if m != "text" {
				return invalid("modalities", "modalities: %q is not supported; only \"text\"", m)
			}
		}
	}
	if !isNull(in.Audio) {
		return invalid("audio", "audio output is not supported")
	}
	switch fc := string(in.FunctionCall); {
	case isNull(in.FunctionCall), fc == `"none"`, fc == `"auto"`:
	default:
		return invalid("function_call", "function_call: functions are not supported")
	}
	return nil
}

// constrain reads response_format and grammar into sp.Grammar, the GBNF
// grammar the workers constrain the output to.
func (h *Handler) constrain(c *commonRequest, sp *batonv1.SamplingParams) *httpError {
	var gbnf string
	jsonFormat := ""
	if rf := c.ResponseFormat; rf != nil {
		if rf.Type == nil {
			return invalid("response_format.type", `response_format.type is required: "text", "json_object" or "json_schema"`)
		}
		switch t := *rf.Type; t {
		case "text", "json_object":
			if rf.JSONSchema != nil {
				return invalid("response_format.json_schema", `response_format.json_schema is allowed only with type "json_schema"`)
			}
			if t == "json_object" {
				g, err := anyObjectGrammar()
				if err != nil {
					return invalid("response_format", "response_format %q: %v", t, err)
				}
				jsonFormat, gbnf = t, g
			}
		case "json_schema":
			g, herr := schemaGrammar(rf.JSONSchema)
			if herr != nil {
				return herr
			}
			jsonFormat, gbnf = t, g
		default:
			return invalid("response_format.type", `response_format.type %q: want "text", "json_object" or "json_schema"`, t)
		}
	}
	if c.Grammar != nil {
		switch {
		case jsonFormat != "":
			return invalid("grammar", "grammar and response_format %q both constrain the output: give one", jsonFormat)
		case *c.Grammar == "":
			return invalid("grammar", "grammar is empty")
		}
		if err := parseGrammar(*c.Grammar); err != nil {
			return invalid("grammar", "grammar: %v", err)
		}
		gbnf = *c.Grammar
	}
	sp.Grammar = gbnf
	return nil
}

// schemaGrammar checks response_format.json_schema and compiles its schema
// to GBNF, so that a schema Baton cannot follow is refused here, naming the
// keyword, rather than by a worker.
func schemaGrammar(js *jsonSchemaFormat) (string, *httpError) {
	const p = "response_format.json_schema"
	switch {
	case js == nil:
		return "", invalid(p, `response_format.json_schema is required with type "json_schema"`)
	case js.Name == nil:
		return "", invalid(p+".name", "response_format.json_schema.name is required")
	case !schemaName.MatchString(*js.Name):
		return "", invalid(p+".name", "response_format.json_schema.name %q: want 1-64 characters of a-z, A-Z, 0-9, _ and -", *js.Name)
	}
	if isNull(js.Schema) {
		// No schema: any JSON object, as json_object asks (not any
		// JSON value, which {} would allow).
		g, _ := anyObjectGrammar()
		return g, nil
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(js.Schema, &obj); err != nil {
		return "", invalid(p+".schema", "response_format.json_schema.schema: expected a JSON Schema object")
	}
	g, err := compileSchema(js.Schema)
	if err != nil {
		return "", invalid(p+".schema", "response_format.json_schema.schema: %v", err)
	}
	return g, nil
}
