package openai

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strconv"

	"github.com/baton-serving/baton/svckit"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// OpenAI error types (the "type" field of an error object).
const (
	typeInvalidRequest = "invalid_request_error"
	typePermission     = "permission_error"
	typeRateLimit      = "rate_limit_error"
	typeServer         = "server_error"
)

// RetryAfterSeconds is what Retry-After says on 429 and 503 answers: the
// router holds no queue, so a client should simply try again shortly.
const RetryAfterSeconds = 1

// statusClientClosed is the status recorded for a client that went away
// (nginx's convention); the client never sees it.
const statusClientClosed = 499

// httpError is one error answer in OpenAI's shape.
type httpError struct {
	status  int
	typ     string
	message string
	param   string // "" is JSON null
	code    string // "" is JSON null
	// ran: the error is the outcome of a request the router ran, which
	// its run counted already; every other error answer is a refusal,
	// counted when written (see CountRefusals).
	ran bool
}

func (e *httpError) Error() string { return e.message }

// invalid is a 400 naming the request field param.
func invalid(param, format string, a ...any) *httpError {
	return &httpError{status: http.StatusBadRequest, typ: typeInvalidRequest, param: param, message: fmt.Sprintf(format, a...)}
}

// bodyTimeout is the 408 for a request body the client did not finish
// sending within --http-body-timeout (svckit.ErrBodyTimeout): the request
// was late, not malformed, so it is no 400.
func bodyTimeout() *httpError {
	return &httpError{status: http.StatusRequestTimeout, typ: typeInvalidRequest, code: "request_timeout",
		message: svckit.ErrBodyTimeout.Error() + ": send the whole body promptly"}
}

// withCode sets the error's machine-readable code.
func (e *httpError) withCode(code string) *httpError {
	e.code = code
	return e
}

// codeTable maps the gRPC status codes a Generator returns to HTTP statuses
// and OpenAI error types. It is the one place the mapping lives; the REST
// gateway's errors go through it too (WriteStatusError).
var codeTable = map[codes.Code]struct {
	status int
	typ    string
	code   string // default machine-readable code; "" for none
}{
	codes.InvalidArgument:    {http.StatusBadRequest, typeInvalidRequest, ""},
	codes.OutOfRange:         {http.StatusBadRequest, typeInvalidRequest, ""},
	codes.FailedPrecondition: {http.StatusBadRequest, typeInvalidRequest, ""},
	codes.Unauthenticated:    {http.StatusUnauthorized, typeInvalidRequest, "invalid_api_key"},
	codes.PermissionDenied:   {http.StatusForbidden, typePermission, ""},
	codes.NotFound:           {http.StatusNotFound, typeInvalidRequest, "not_found"},
	codes.AlreadyExists:      {http.StatusConflict, typeInvalidRequest, "request_id_in_flight"},
	codes.Aborted:            {http.StatusConflict, typeInvalidRequest, "aborted"},
	codes.ResourceExhausted:  {http.StatusTooManyRequests, typeRateLimit, "rate_limit_exceeded"},
	codes.Canceled:           {statusClientClosed, typeInvalidRequest, "cancelled"},
	codes.Unimplemented:      {http.StatusNotImplemented, typeServer, "not_implemented"},
	codes.Unavailable:        {http.StatusServiceUnavailable, typeServer, "service_unavailable"},
	codes.DeadlineExceeded:   {http.StatusGatewayTimeout, typeServer, "timeout"},
	codes.Internal:           {http.StatusInternalServerError, typeServer, ""},
	codes.Unknown:            {http.StatusInternalServerError, typeServer, ""},
	codes.DataLoss:           {http.StatusInternalServerError, typeServer, ""},
}

// HTTPStatus is the HTTP status the OpenAI API answers for a gRPC code.
func HTTPStatus(c codes.Code) int {
	if e, ok := codeTable[c]; ok {
		return e.status
	}
	return http.StatusInternalServerError
}

// fieldPrefix matches the wire path that Baton's validation errors start
// with ("sampling.temperature = 3: ...", "prompt: 130 tokens ...",
// `model "x" is not served`).
var fieldPrefix = regexp.MustCompile(`^([a-z_]+(?:\.[a-z_]+|\[[0-9]+\])*)(?:[ :=]|$)`)

// wireParams maps a GenerateRequest field path to the OpenAI request field
// it came from; promptParam stands for "prompt" or "messages".
var wireParams = map[string]string{
	"model":                       "model",
	"request_id":                  "X-Request-Id",
	"prompt":                      promptParam,
	"prompt_token_ids":            promptParam,
	"sampling.temperature":        "temperature",
	"sampling.top_p":              "top_p",
	"sampling.top_k":              "top_k",
	"sampling.min_p":              "min_p",
	"sampling.repetition_penalty": "repetition_penalty",
	"sampling.frequency_penalty":  "frequency_penalty",
	"sampling.presence_penalty":   "presence_penalty",
	"sampling.max_new_tokens":     "max_tokens",
	"sampling.stop":               "stop",
	"sampling.stop_token_ids":     "stop",
	"sampling.top_logprobs":       "top_logprobs",
	"sampling.seed":               "seed",
	"sampling.logit_bias":         "logit_bias",
	"sampling.grammar":            "grammar",
	"sampling.json_schema":        "response_format",
}

const promptParam = "\x00prompt"

// fromStatus converts an error from a Generator into the OpenAI error,
// naming the request field when the message starts with a known wire path.
// prompt is the request's prompt field ("prompt" or "messages").
func fromStatus(err error, prompt string) *httpError {
	st := status.Convert(err)
	e, ok := codeTable[st.Code()]
	if !ok {
		e = codeTable[codes.Internal]
	}
	out := &httpError{status: e.status, typ: e.typ, code: e.code, message: st.Message(), ran: true}
	if m := fieldPrefix.FindStringSubmatch(st.Message()); m != nil {
		path := m[1]
		if i := indexOfBracket(path); i >= 0 {
			path = path[:i]
		}
		if p, ok := wireParams[path]; ok {
			if p == promptParam {
				p = prompt
			}
			out.param = p
			if p == "model" && st.Code() == codes.NotFound {
				out.code = "model_not_found"
			}
		}
	}
	return out
}

func indexOfBracket(s string) int {
	for i := range len(s) {
		if s[i] == '[' {
			return i
		}
	}
	return -1
}

// errorBody is the JSON form of an error answer.
type errorBody struct {
	Error errorObject `json:"error"`
}

type errorObject struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

func (e *httpError) body() errorBody {
	b := errorBody{Error: errorObject{Message: e.message, Type: e.typ}}
	if e.param != "" {
		b.Error.Param = &e.param
	}
	if e.code != "" {
		b.Error.Code = &e.code
	}
	return b
}

// write sends e as the whole HTTP answer to r (nil for an answer to a
// request the router ran), counting it when it is a refusal. It is the one
// place error answers are written.
func (e *httpError) write(w http.ResponseWriter, r *http.Request) {
	if !e.ran && r != nil {
		if count, ok := r.Context().Value(refusalsCtx{}).(func(codes.Code)); ok {
			count(refusalCode(e.status))
		}
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	switch e.status {
	case http.StatusTooManyRequests, http.StatusServiceUnavailable:
		h.Set("Retry-After", strconv.Itoa(RetryAfterSeconds))
	case http.StatusUnauthorized:
		h.Set("WWW-Authenticate", `Bearer realm="baton"`)
	}
	w.WriteHeader(e.status)
	b, _ := json.Marshal(e.body())
	_, _ = w.Write(append(b, '\n'))
}

// refusalCodes are the gRPC codes refusals are counted under
// (baton_router_requests_total's code label), for the statuses the HTTP
// layers answer without running the request; they are the codes
// grpc-gateway and grpc-go use for the same conditions.
var refusalCodes = map[int]codes.Code{
	http.StatusBadRequest:            codes.InvalidArgument,
	http.StatusUnauthorized:          codes.Unauthenticated,
	http.StatusForbidden:             codes.PermissionDenied,
	http.StatusNotFound:              codes.NotFound,
	http.StatusMethodNotAllowed:      codes.Unimplemented,
	http.StatusRequestTimeout:        codes.DeadlineExceeded,
	http.StatusConflict:              codes.AlreadyExists,
	http.StatusRequestEntityTooLarge: codes.ResourceExhausted, // grpc-go's "message larger than max"
	http.StatusTooManyRequests:       codes.ResourceExhausted,
	http.StatusServiceUnavailable:    codes.Unavailable,
	http.StatusGatewayTimeout:        codes.DeadlineExceeded,
}

func refusalCode(status int) codes.Code {
	if c, ok := refusalCodes[status]; ok {
		return c
	}
	return codes.Internal
}

type refusalsCtx struct{}

// CountRefusals has every refusal answered under next — an error answer
// for a request that never reached the router's run (a missing key, a body
// too large or too slow, an unknown path, a wrong method, a malformed
// request) — reported to count with its gRPC code, so that the router's
// request counter sees them like the requests it ran. A nil count counts
// nothing.
func CountRefusals(count func(codes.Code), next http.Handler) http.Handler {
	if count == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), refusalsCtx{}, count)))
	})
}

// unknownURL is OpenAI's answer for a path it does not serve.
func unknownURL(r *http.Request) *httpError {
	return &httpError{status: http.StatusNotFound, typ: typeInvalidRequest, code: "unknown_url",
		message: fmt.Sprintf("Invalid URL (%s %s)", r.Method, r.URL.Path)}
}

// methodNotAllowed answers a method path does not accept; allow lists the
// ones it does (the Allow header).
func methodNotAllowed(w http.ResponseWriter, r *http.Request, allow string) *httpError {
	w.Header().Set("Allow", allow)
	return &httpError{status: http.StatusMethodNotAllowed, typ: typeInvalidRequest, code: "method_not_allowed",
		message: fmt.Sprintf("Invalid method for URL (%s %s): it accepts %s", r.Method, r.URL.Path, allow)}
}

// WriteRoutingError answers a request under /v1 that no route takes
// (grpc-gateway's routing errors): 404 unknown_url, or 405 with allow as
// the Allow header.
func WriteRoutingError(w http.ResponseWriter, r *http.Request, httpStatus int, allow string) {
	if httpStatus == http.StatusMethodNotAllowed {
		methodNotAllowed(w, r, allow).write(w, r)
		return
	}
	e := unknownURL(r)
	if httpStatus != http.StatusNotFound {
		e = &httpError{status: httpStatus, typ: typeInvalidRequest, message: http.StatusText(httpStatus)}
	}
	e.write(w, r)
}

// WriteStatusError answers r with err, a gRPC status, in OpenAI's shape
// and with the status codeTable maps its code to: the REST gateway's error
// answers. param names the wire field (a GenerateRequest path such as
// "sampling.temperature") the message starts with. ran says whether the
// request reached the router's run (which counted it); otherwise the
// answer is counted as a refusal.
func WriteStatusError(w http.ResponseWriter, r *http.Request, err error, ran bool) {
	e := fromWireStatus(err)
	e.ran = ran
	if e.status == statusClientClosed {
		return // nobody is listening
	}
	e.write(w, r)
}

// fromWireStatus is fromStatus naming the wire field (the GenerateRequest
// path), as the REST gateway's clients send it.
func fromWireStatus(err error) *httpError {
	e := fromStatus(err, "prompt")
	if m := fieldPrefix.FindStringSubmatch(status.Convert(err).Message()); m != nil && e.param != "" {
		e.param = m[1]
		if i := indexOfBracket(e.param); i >= 0 {
			e.param = e.param[:i]
		}
	}
	return e
}

// StatusErrorJSON is err, a gRPC status, as an OpenAI error object
// ({"error":{...}}): the line that ends a REST gateway stream with an
// error.
func StatusErrorJSON(err error) ([]byte, error) {
	return json.Marshal(fromWireStatus(err).body())
}
