package openai

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"reflect"
	"strings"
	"time"

	"github.com/baton-serving/baton/engine/tokenizer"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/router-svc/internal/clientwrite"
	"github.com/baton-serving/baton/svckit/apiconv"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// Generator runs one generation request and passes its events to send, in
// order: the first carries prompt_token_ids, each carries the token ids and
// text generated since the previous one, and the last carries finish_reason
// and usage. It returns a gRPC status error when the request fails; it must
// stop promptly, releasing everything the request holds, when ctx ends or
// send returns an error. The router's Service implements it.
type Generator interface {
	Generate(ctx context.Context, req *batonv1.GenerateRequest, send func(*batonv1.GenerateEvent) error) error
}

// GeneratorFunc adapts a function to Generator.
type GeneratorFunc func(ctx context.Context, req *batonv1.GenerateRequest, send func(*batonv1.GenerateEvent) error) error

// Generate calls f.
func (f GeneratorFunc) Generate(ctx context.Context, req *batonv1.GenerateRequest, send func(*batonv1.GenerateEvent) error) error {
	return f(ctx, req, send)
}

// Model describes the served model.
type Model struct {
	ID            string // the name clients pass as "model"
	Created       int64  // Unix seconds
	OwnedBy       string
	Architecture  string
	Fingerprint   string // "sha256:<hex>"
	ContextLength int
	Tokenizer     *tokenizer.Tokenizer
}

// Limits bound what one request may ask for.
type Limits struct {
	// MaxBodyBytes bounds a request body; larger ones get 413.
	MaxBodyBytes int64
	// MaxPromptTokens bounds the prompt; 0 leaves only the context window.
	MaxPromptTokens int
	// DefaultMaxTokens is generated when a request does not say (capped by
	// the context window).
	DefaultMaxTokens int
	// MaxNewTokens bounds max_tokens; 0 leaves only the context window.
	MaxNewTokens int
	// WriteTimeout is a stream's minimum progress (package clientwrite):
	// an event the client has not taken within it of being queued aborts
	// the request — a client that takes nothing, or drips and falls
	// behind. 0: no bound but RequestTimeout.
	WriteTimeout time.Duration
	// RequestTimeout bounds a stream as the Generator bounds the request,
	// so that a client that stops reading cannot hold the stream's
	// goroutine and connection past it. 0: no bound.
	RequestTimeout time.Duration
	// MaxN bounds n, the choices of one request (the router's --max-n);
	// 0 means apiconv.DefaultMaxN.
	MaxN int
}

// Options configure a Handler.
type Options struct {
	Model  Model
	Limits Limits
	// Template renders chat prompts; nil compiles the model's own
	// tokenizer.chat_template (or the plain default).
	Template *ChatTemplate
	// Keys, when not nil, are the API keys every request must present.
	Keys   *Keys
	Logger *slog.Logger
	// Refused, when not nil, counts the refusals the handler answers
	// without running the request (see CountRefusals).
	Refused func(codes.Code)
	// Admits says that the Generator bounds the requests it runs at once
	// and calls Admitted once it has admitted one: the handler then leaves
	// the prompt's rendering and tokenizing to that moment (admit.go).
	// Otherwise it does them before calling the Generator.
	Admits bool
	// Lenient (--openai-lenient) logs and ignores request fields Baton
	// does not know instead of refusing them with 400.
	Lenient bool
	// MaxTokenBytes is MaxTokenBytes of the model's tokenizer when the
	// caller has it already (0: New computes it; it walks the vocabulary).
	MaxTokenBytes int
}

// Handler serves the OpenAI-compatible API.
type Handler struct {
	gen         Generator
	model       Model
	limits      Limits
	tmpl        *ChatTemplate
	keys        *Keys
	log         *slog.Logger
	fingerprint string
	// markers: the template's tool-call family's control-token markers
	// (toolmarkers.go).
	markers map[uint32]string
	refused func(codes.Code)
	lenient bool
	admits  bool
	// maxTokenBytes is MaxTokenBytes of the model's tokenizer and
	// maxPromptBytes the longest prompt text that may fit (admit.go).
	maxTokenBytes  int
	maxPromptBytes int64
	// encode tokenizes a prompt (the model's tokenizer; tests count it).
	encode func(text string, opts tokenizer.EncodeOptions) []int32
}

// New returns a Handler that runs requests on gen.
func New(gen Generator, opts Options) (*Handler, error) {
	m := opts.Model
	switch {
	case gen == nil:
		return nil, errors.New("openai: nil Generator")
	case m.Tokenizer == nil:
		return nil, errors.New("openai: the model has no tokenizer")
	case m.ID == "" || m.ContextLength < 2:
		return nil, fmt.Errorf("openai: model %q with context length %d", m.ID, m.ContextLength)
	case opts.Limits.MaxBodyBytes <= 0 || opts.Limits.DefaultMaxTokens < 1 || opts.Limits.MaxPromptTokens < 0 || opts.Limits.MaxNewTokens < 0 || opts.Limits.MaxN < 0:
		return nil, fmt.Errorf("openai: invalid limits %+v", opts.Limits)
	}
	if opts.Limits.MaxN == 0 {
		opts.Limits.MaxN = apiconv.DefaultMaxN
	}
	h := &Handler{gen: gen, model: m, limits: opts.Limits, tmpl: opts.Template, keys: opts.Keys, log: opts.Logger,
		refused: opts.Refused, lenient: opts.Lenient,
		admits: opts.Admits, maxTokenBytes: opts.MaxTokenBytes, encode: m.Tokenizer.Encode}
	if h.maxTokenBytes <= 0 {
		h.maxTokenBytes = MaxTokenBytes(m.Tokenizer)
	}
	h.maxPromptBytes = promptByteLimit(m, opts.Limits, h.maxTokenBytes)
	if h.tmpl == nil {
		var err error
		if h.tmpl, err = ChatTemplateFor(m.Tokenizer, ""); err != nil {
			return nil, fmt.Errorf("model %s: %w", m.ID, err)
		}
	}
	h.markers = markerIDs(m.Tokenizer, h.tmpl.family)
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	fp := strings.TrimPrefix(m.Fingerprint, "sha256:")
	if len(fp) > 12 {
		fp = fp[:12]
	}
	if fp != "" {
		h.fingerprint = "fp_" + fp
	}
	return h, nil
}

// Register mounts the API on mux: POST /v1/completions,
// POST /v1/chat/completions, GET /v1/models and GET /v1/models/{model}.
// The more specific patterns take precedence over a catch-all "/v1/" such as
// the REST gateway's.
func (h *Handler) Register(mux *http.ServeMux) {
	handle := func(pattern string, next http.Handler) {
		mux.Handle(pattern, CountRefusals(h.refused, next))
	}
	auth := h.keys.Middleware
	handle("POST /v1/completions", auth(http.HandlerFunc(h.completions)))
	handle("POST /v1/chat/completions", auth(http.HandlerFunc(h.chatCompletions)))
	handle("GET /v1/models", auth(http.HandlerFunc(h.listModels)))
	handle("GET /v1/models/{model}", auth(http.HandlerFunc(h.getModel)))
	// Other methods on these paths are 405s here, not the REST
	// gateway's (the catch-all "/v1/") 404s.
	for p, allow := range map[string]string{"/v1/completions": http.MethodPost, "/v1/chat/completions": http.MethodPost,
		"/v1/models": "GET, HEAD", "/v1/models/{model}": "GET, HEAD"} {
		handle(p, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			methodNotAllowed(w, r, allow).write(w, r)
		}))
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := marshal(v)
	if err != nil {
		(&httpError{status: http.StatusInternalServerError, typ: typeServer, message: "encoding the response: " + err.Error(), ran: true}).write(w, nil)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// marshal is json.Marshal without HTML escaping: generated text is shown
// as it is, "<" and all.
func marshal(v any) ([]byte, error) {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return []byte(strings.TrimSuffix(b.String(), "\n")), nil
}

// requestID is the client's X-Request-Id, validated, or a new id.
func requestID(r *http.Request) (string, *httpError) {
	id := r.Header.Get("X-Request-Id")
	if id == "" {
		var b [12]byte
		_, _ = rand.Read(b[:])
		return hex.EncodeToString(b[:]), nil
	}
	if err := apiconv.ValidRequestID(id); err != nil {
		return "", invalid("X-Request-Id", "X-Request-Id %q: want 1-%d characters of A-Z a-z 0-9 . _ : -", id, apiconv.MaxRequestIDLen)
	}
	return id, nil
}

// job is a validated request ready to run.
type job struct {
	req          *batonv1.GenerateRequest
	stream       bool
	includeUsage bool
	n            int        // choices (n), at least 1
	promptParam  string     // "prompt" or "messages"
	tools        *toolSetup // the chat request's tools; nil: none
	// markers are the tool-call marker tokens put back into the text
	// when the output is parsed for calls (toolmarkers.go).
	markers map[uint32]string
	created int64
	// echo (completions): the response's text and logprobs start with the
	// prompt's; SamplingParams.prompt_logprobs asks the workers for them.
	echo bool
	// promptOnly (completions, max_tokens 0 with echo): the workers
	// generate one token, which the response drops, so that only the
	// prompt's text and logprobs are returned, finish_reason "length".
	promptOnly bool
	// prepare is the validation left for after admission: rendering and
	// tokenizing the prompt, and the checks that need its tokens
	// (admit.go). It sets req.prompt_token_ids.
	prepare func() *httpError
}

// completions serves POST /v1/completions.
func (h *Handler) completions(w http.ResponseWriter, r *http.Request) {
	var in completionRequest
	j, herr := h.decode(w, r, &in)
	if herr == nil {
		herr = h.prepareCompletion(&in, j)
	}
	if herr != nil {
		h.fail(w, r, j, herr)
		return
	}
	h.serve(w, r, j, j.formats(func() format { return &completionFormat{h: h, j: j, logprobs: in.Logprobs != nil} }))
}

// chatCompletions serves POST /v1/chat/completions.
func (h *Handler) chatCompletions(w http.ResponseWriter, r *http.Request) {
	var in chatRequest
	j, herr := h.decode(w, r, &in)
	if herr == nil {
		herr = h.prepareChat(&in, j)
	}
	if herr != nil {
		h.fail(w, r, j, herr)
		return
	}
	h.serve(w, r, j, j.formats(func() format { return &chatFormat{h: h, j: j, logprobs: in.Logprobs != nil && *in.Logprobs} }))
}

// decode reads and decodes the body into v and starts the job.
func (h *Handler) decode(w http.ResponseWriter, r *http.Request, v any) (*job, *httpError) {
	j := &job{created: time.Now().Unix(), req: &batonv1.GenerateRequest{Model: h.model.ID}}
	id, herr := requestID(r)
	if herr != nil {
		return j, herr
	}
	j.req.RequestId = id
	w.Header().Set("X-Request-Id", id)
	body, herr := readBody(w, r, h.limits.MaxBodyBytes)
	if herr != nil {
		return j, herr
	}
	switch v.(type) { // a hopeless prompt costs no decoding (admit.go)
	case *completionRequest:
		if herr := h.precheckCompletion(body); herr != nil {
			return j, herr
		}
	case *chatRequest:
		if herr := h.precheckChat(body); herr != nil {
			return j, herr
		}
	}
	if h.lenient {
		// The unknown fields are left out of what is decoded: keys match
		// exactly, as the known names are spelled (fields.go).
		if ignored, _ := checkFields(body, v, true); len(ignored) > 0 {
			h.log.InfoContext(r.Context(), "openai request: ignoring unknown fields (--openai-lenient)", "path", r.URL.Path,
				"request_id", id, "fields", ignored)
			body = withoutUnknown(body, reflect.TypeOf(v).Elem())
		}
		return j, decodeJSON(body, v)
	}
	if herr := decodeJSON(body, v); herr != nil {
		return j, herr
	}
	_, herr = checkFields(body, v, false)
	return j, herr
}

// fail answers a request that produced no output with herr.
func (h *Handler) fail(w http.ResponseWriter, r *http.Request, j *job, herr *httpError) {
	level := slog.LevelInfo
	if herr.status >= 500 {
		level = slog.LevelWarn
	}
	h.log.Log(r.Context(), level, "openai request refused", "path", r.URL.Path, "request_id", j.req.GetRequestId(),
		"status", herr.status, "param", herr.param, "err", herr.message)
	if herr.status == statusClientClosed {
		return // nobody is listening
	}
	herr.write(w, r)
}

// errAborted ends a generation whose last event says it was aborted.
var errAborted = status.Error(codes.Aborted, "the request was aborted")

// errNoFinish is a Generator that ended its stream without a last event.
var errNoFinish = status.Error(codes.Internal, "generation ended without a finish reason")

// format turns events into one endpoint's response objects.
type format interface {
	// whole is the non-streaming response.
	whole(o *output) any
	// opening are the first chunks of a stream, or nil.
	opening() []any
	// chunks are the stream chunks for one event (the last event's include
	// its finish reason).
	chunks(ev *batonv1.GenerateEvent) []any
	// usage is the extra chunk that carries usage when the client asked.
	usage(u *usageObject) any
}

// remoteAddr is an HTTP client's address as a net.Addr.
type remoteAddr string

func (remoteAddr) Network() string  { return "tcp" }
func (a remoteAddr) String() string { return string(a) }

// serve runs j and answers in one piece or as server-sent events.
func (h *Handler) serve(w http.ResponseWriter, r *http.Request, j *job, f format) {
	// The Generator sees the HTTP client as a gRPC client's peer, so that the
	// router's in-flight list names who asked.
	ctx := peer.NewContext(r.Context(), &peer.Peer{Addr: remoteAddr(r.RemoteAddr)})
	// The prompt is rendered and tokenized once the Generator admitted the
	// request (admit.go); its refusal is answered as it is.
	var prepErr *httpError
	if prep := j.prepare; prep != nil && !h.admits {
		if herr := prep(); herr != nil {
			h.fail(w, r, j, herr)
			return
		}
	} else if prep != nil {
		ctx = WithAdmission(ctx, func() error {
			if herr := prep(); herr != nil {
				herr.ran = true // the Generator counts it as its outcome
				prepErr = herr
				return status.Error(refusalCode(herr.status), herr.message)
			}
			return nil
		})
	}
	answer := func(err error) *httpError {
		if prepErr != nil {
			return prepErr
		}
		return fromStatus(err, j.promptParam)
	}
	out := newOutput(j.n)
	if !j.stream {
		err := h.gen.Generate(ctx, j.req, func(ev *batonv1.GenerateEvent) error {
			if ev.GetFinishReason() == batonv1.FinishReason_FINISH_REASON_ABORT {
				return errAborted
			}
			out.add(j.withMarkers(h.model.Tokenizer, ev))
			return nil
		})
		if err == nil && out.finish == batonv1.FinishReason_FINISH_REASON_UNSPECIFIED {
			err = errNoFinish
		}
		if err != nil {
			h.fail(w, r, j, answer(err))
			return
		}
		writeJSON(w, http.StatusOK, f.whole(out))
		return
	}

	// Headers wait for the first event, so that a request refused before
	// any output (busy, duplicate id, no worker) still gets its real status.
	// The stream ends shortly after the request's deadline whatever its
	// client does: the Generator ends the request at that deadline
	// (DEADLINE_EXCEEDED, answered to the client) and interrupts the
	// stream, as it does sooner for an Abort; this bound is the backstop.
	if t := h.limits.RequestTimeout; t > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, t+sseTailGrace)
		defer cancel()
	}
	s := newSSE(ctx, w, r, h.limits.WriteTimeout)
	defer s.close()
	ctx = clientwrite.WithInterrupt(ctx, s.interrupt)
	err := h.gen.Generate(ctx, j.req, func(ev *batonv1.GenerateEvent) error {
		if ev.GetFinishReason() == batonv1.FinishReason_FINISH_REASON_ABORT {
			return errAborted
		}
		ev = j.withMarkers(h.model.Tokenizer, ev)
		out.add(ev)
		if !s.started {
			if err := s.start(); err != nil {
				return err // the request has ended: answered with its status
			}
			for _, c := range f.opening() {
				if err := s.send(c); err != nil {
					return err
				}
			}
		}
		for _, c := range f.chunks(ev) {
			if err := s.send(c); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil && out.finish == batonv1.FinishReason_FINISH_REASON_UNSPECIFIED {
		err = errNoFinish
	}
	switch {
	case err != nil && !s.started:
		s.refuse(func() { h.fail(w, r, j, answer(err)) })
	case err != nil:
		// A request ended by its deadline, an Abort, the router's drain
		// or a worker's death is answered with an error event and then
		// [DONE] (the writer has a grace for them, see interrupt), so that
		// a cut-off answer never reads as a finished one; one whose
		// client left, or could not be written, is not. (The router's
		// run logs who ended the request.)
		if r.Context().Err() != nil || s.failed() {
			h.log.InfoContext(r.Context(), "openai stream ended by the client", "request_id", j.req.GetRequestId(), "err", err)
			return
		}
		herr := fromStatus(err, j.promptParam)
		h.log.WarnContext(r.Context(), "openai stream failed", "request_id", j.req.GetRequestId(), "status", herr.status, "err", herr.message)
		if s.send(herr.body()) == nil {
			_ = s.done()
		}
	default:
		if j.includeUsage {
			if err := s.send(f.usage(out.usage(j.req))); err != nil {
				return
			}
		}
		_ = s.done()
	}
}
