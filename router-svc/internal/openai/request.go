package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"unicode/utf8"

	"github.com/baton-serving/baton/svckit"
)

// commonRequest holds the fields completions and chat completions share.
// Pointers tell an absent (or null) field from a zero one. The JSON names of
// these structs' fields are the only ones a request may carry (see
// unknownField): every field here is honoured, or checked and refused when
// its value asks for what Baton does not do, or (user, metadata, store
// false, service_tier auto) accepted as the no-op a client expects.
type commonRequest struct {
	Model            string          `json:"model"`
	MaxTokens        *int64          `json:"max_tokens"`
	Temperature      *float64        `json:"temperature"`
	TopP             *float64        `json:"top_p"`
	N                *int64          `json:"n"`
	Stream           bool            `json:"stream"`
	StreamOptions    *streamOptions  `json:"stream_options"`
	Stop             json.RawMessage `json:"stop"`
	Seed             *int64          `json:"seed"`
	PresencePenalty  *float64        `json:"presence_penalty"`
	FrequencyPenalty *float64        `json:"frequency_penalty"`
	// LogitBias is read by parseLogitBias, so that every fault in it
	// names logit_bias.
	LogitBias      json.RawMessage `json:"logit_bias"`
	ResponseFormat *responseFormat `json:"response_format"`
	// User identifies the end user to OpenAI's abuse monitoring; Baton
	// accepts it and does nothing with it.
	User string `json:"user"`

	// Extensions many OpenAI-compatible servers accept.
	TopK              *int64   `json:"top_k"`
	MinP              *float64 `json:"min_p"`
	RepetitionPenalty *float64 `json:"repetition_penalty"`
	IgnoreEOS         bool     `json:"ignore_eos"`
	// Grammar is llama.cpp's GBNF grammar field (start rule "root").
	Grammar *string `json:"grammar"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// responseFormat is response_format: "text", "json_object" or
// "json_schema" with its json_schema.
type responseFormat struct {
	Type       *string           `json:"type"`
	JSONSchema *jsonSchemaFormat `json:"json_schema"`
}

type jsonSchemaFormat struct {
	Name        *string         `json:"name"`
	Description *string         `json:"description"`
	Schema      json.RawMessage `json:"schema"`
	// Strict is accepted either way: Baton always constrains the output
	// to the schema.
	Strict *bool `json:"strict"`
}

// completionRequest is the body of POST /v1/completions.
type completionRequest struct {
	commonRequest
	Prompt   json.RawMessage `json:"prompt"`
	Logprobs *int64          `json:"logprobs"`
	Echo     bool            `json:"echo"`
	Suffix   *string         `json:"suffix"`
	BestOf   *int64          `json:"best_of"`
}

// chatRequest is the body of POST /v1/chat/completions.
type chatRequest struct {
	commonRequest
	Messages            []chatMessage   `json:"messages"`
	MaxCompletionTokens *int64          `json:"max_completion_tokens"`
	Logprobs            *bool           `json:"logprobs"`
	TopLogprobs         *int64          `json:"top_logprobs"`
	Tools               json.RawMessage `json:"tools" fields:"tool"`
	ToolChoice          json.RawMessage `json:"tool_choice" fields:"tool_choice"`
	ParallelToolCalls   *bool           `json:"parallel_tool_calls"`
	Functions           json.RawMessage `json:"functions"`
	FunctionCall        json.RawMessage `json:"function_call"`
	// Metadata (at most 16 string pairs) and Store (false only) are
	// OpenAI's stored-completions fields; Baton stores nothing.
	Metadata json.RawMessage `json:"metadata"`
	Store    *bool           `json:"store"`
	// ServiceTier "auto" or "default": Baton has one tier.
	ServiceTier *string `json:"service_tier"`
	// Modalities ["text"] only; Audio (output audio) is refused.
	Modalities json.RawMessage `json:"modalities"`
	Audio      json.RawMessage `json:"audio"`
	// Accepted as documented no-ops, as newer SDKs send them: ReasoningEffort
	// and Verbosity steer reasoning models (Baton's models do not reason),
	// PromptCacheKey routes to OpenAI's prompt cache and SafetyIdentifier
	// is user's successor for abuse monitoring.
	ReasoningEffort  *string `json:"reasoning_effort"`
	Verbosity        *string `json:"verbosity"`
	PromptCacheKey   *string `json:"prompt_cache_key"`
	SafetyIdentifier *string `json:"safety_identifier"`
	// ChatTemplateKwargs are extra variables for the chat template, as
	// vLLM and llama-server accept them ({"enable_thinking": false} for
	// Qwen3); read by parseTemplateKwargs.
	ChatTemplateKwargs json.RawMessage `json:"chat_template_kwargs"`
}

// chatMessage is one of messages. Refusal and Annotations, which the SDKs
// return in an assistant message and clients send back in the history, are
// accepted and ignored; Audio and FunctionCall are refused unless null.
type chatMessage struct {
	Role         string          `json:"role"`
	Content      json.RawMessage `json:"content" fields:"content_part"`
	Name         string          `json:"name"`
	ToolCalls    json.RawMessage `json:"tool_calls" fields:"tool_call"`
	ToolCallID   string          `json:"tool_call_id"`
	Refusal      json.RawMessage `json:"refusal"`
	Annotations  json.RawMessage `json:"annotations"`
	Audio        json.RawMessage `json:"audio"`
	FunctionCall json.RawMessage `json:"function_call"`
}

// readBody reads a request body of at most limit bytes: 413 beyond it, 408
// when the client does not deliver it within --http-body-timeout.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, *httpError) {
	if r.ContentLength > limit {
		return nil, tooLarge(limit)
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, tooLarge(limit)
		}
		if errors.Is(err, svckit.ErrBodyTimeout) {
			return nil, bodyTimeout()
		}
		return nil, invalid("", "reading the request body: %v", err)
	}
	return body, nil
}

// decodeJSON decodes body into v. Every error is a 400 that names the
// offending field by its JSON path (messages[1].role) where there is one.
// Invalid UTF-8 is refused rather than silently replaced, as encoding/json
// would do.
func decodeJSON(body []byte, v any) *httpError {
	if !utf8.Valid(body) {
		off := invalidUTF8At(body)
		return invalid(pathAt(body, int64(off)), "request body: invalid UTF-8 at byte offset %d", off)
	}
	err := json.Unmarshal(body, v)
	if err == nil {
		return nil
	}
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		return invalid("", "malformed JSON at byte offset %d: %v", syn.Offset, syn)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return invalid("", "malformed JSON: unexpected end of input")
	case errors.As(err, &typ):
		p := pathAt(body, typ.Offset)
		if p == "" {
			return invalid("", "the request body must be a JSON object, not %s", article(typ.Value))
		}
		return invalid(p, "%s: expected %s, got %s", p, jsonKind(typ.Type.Kind().String()), article(typ.Value))
	default:
		return invalid("", "malformed JSON: %v", err)
	}
}

// jsonKind names a Go kind the way a JSON client thinks of it.
func jsonKind(k string) string {
	switch k {
	case "string":
		return "a string"
	case "bool":
		return "a boolean"
	case "int", "int8", "int16", "int32", "int64", "uint", "uint8", "uint16", "uint32", "uint64":
		return "an integer"
	case "float32", "float64":
		return "a number"
	case "slice", "array":
		return "an array"
	case "map", "struct":
		return "an object"
	}
	return k
}

// article puts "a"/"an" before a JSON value kind as encoding/json names it
// ("number 1.5", "string", "array").
func article(v string) string {
	if v == "" {
		return "a value"
	}
	switch v[0] {
	case 'a', 'e', 'i', 'o', 'u':
		return "an " + v
	}
	return "a " + v
}

func invalidUTF8At(b []byte) int {
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n == 1 {
			return i
		}
		i += n
	}
	return -1
}

// pathAt returns the JSON path (e.g. "messages[1].content") of the innermost
// value of body that contains byte offset off: for a scalar, off in
// (start, end]; for an array or object, off just past its opening bracket,
// which is where encoding/json reports a container of the wrong type. It
// returns "" for the top-level value or when body cannot be walked that far.
func pathAt(body []byte, off int64) string {
	type frame struct {
		obj     bool
		key     string
		idx     int
		wantKey bool
	}
	var stack []*frame
	path := func() string {
		var b bytes.Buffer
		for i, f := range stack {
			if f.obj {
				if f.wantKey {
					continue // between members: the object itself
				}
				if i > 0 {
					b.WriteByte('.')
				}
				b.WriteString(f.key)
			} else {
				b.WriteString("[" + strconv.Itoa(f.idx) + "]")
			}
		}
		return b.String()
	}
	// Values complete in their parent: objects wait for the next key,
	// arrays move to the next index.
	advance := func() {
		if n := len(stack); n > 0 {
			if top := stack[n-1]; top.obj {
				top.wantKey = true
			} else {
				top.idx++
			}
		}
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	var prevEnd int64
	for {
		tok, err := dec.Token()
		if err != nil {
			return path()
		}
		end := dec.InputOffset()
		start := prevEnd
		for start < end && (body[start] == ' ' || body[start] == '\t' || body[start] == '\n' || body[start] == '\r' || body[start] == ',' || body[start] == ':') {
			start++
		}
		prevEnd = end
		var top *frame
		if n := len(stack); n > 0 {
			top = stack[n-1]
		}
		switch t := tok.(type) {
		case json.Delim:
			switch t {
			case '{', '[':
				if off == start+1 {
					return path()
				}
				stack = append(stack, &frame{obj: t == '{', wantKey: t == '{'})
			default:
				stack = stack[:len(stack)-1]
				advance()
			}
		default:
			if top != nil && top.obj && top.wantKey {
				top.key, _ = t.(string)
				top.wantKey = false
				if start < off && off < end {
					return path()
				}
				continue
			}
			if start < off && off <= end {
				return path()
			}
			advance()
		}
	}
}

// BodyLimit refuses request bodies over limit bytes with 413 (in OpenAI's
// error shape) before next sees them, for handlers that read bodies
// themselves, such as the REST gateway.
func BodyLimit(limit int64, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > limit {
			tooLarge(limit).write(w, r)
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, limit)
		next.ServeHTTP(w, r)
	})
}

func tooLarge(limit int64) *httpError {
	return &httpError{status: http.StatusRequestEntityTooLarge, typ: typeInvalidRequest, code: "request_too_large",
		message: fmt.Sprintf("request body exceeds the limit of %d bytes (--max-body-bytes)", limit)}
}
