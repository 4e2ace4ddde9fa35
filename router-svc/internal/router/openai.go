package router

// The router's limits, its OpenAI-compatible API (package openai) and the
// REST gateway's framing and error details. The limits apply to every API:
// they are enforced in run and prepare, which gRPC, REST and OpenAI requests
// all go through.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/baton-serving/baton/router-svc/internal/openai"
	"github.com/baton-serving/baton/svckit"
	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// limitFlags are the router's request limits and API options.
type limitFlags struct {
	maxPromptTokens    int
	maxNewTokens       int
	maxConcurrent      int
	requestTimeout     time.Duration
	clientWriteTimeout time.Duration
	maxBodyBytes       int64
	apiKeysFile        string
	chatTemplateFile   string
}

// Defaults of the limit flags.
const (
	defaultMaxConcurrent  = 256
	defaultRequestTimeout = 10 * time.Minute
	defaultMaxBodyBytes   = 4 << 20
)

func (l *limitFlags) addFlags(fs *flag.FlagSet) {
	fs.IntVar(&l.maxPromptTokens, "max-prompt-tokens", 0, "longest prompt accepted, in tokens (0: up to the context window less one)")
	fs.IntVar(&l.maxNewTokens, "max-new-tokens-limit", 0, "most tokens one request may ask to generate (0: up to the context window)")
	fs.IntVar(&l.maxConcurrent, "max-concurrent-requests", defaultMaxConcurrent, "requests run at once over all APIs; more are refused with RESOURCE_EXHAUSTED / HTTP 429 and Retry-After (0: no limit)")
	fs.DurationVar(&l.requestTimeout, "request-timeout", defaultRequestTimeout, "longest a request may run, arrival to last token; it travels to the workers as the gRPC deadline (0: no limit)")
	fs.DurationVar(&l.clientWriteTimeout, "client-write-timeout", 30*time.Second, "longest a streaming client (gRPC, REST, SSE) may leave its stream unread; then its request is aborted with DEADLINE_EXCEEDED and releases its workers (0: only --request-timeout bounds it)")
	fs.Int64Var(&l.maxBodyBytes, "max-body-bytes", defaultMaxBodyBytes, "largest HTTP request body (REST and OpenAI APIs); larger ones get 413")
	fs.StringVar(&l.apiKeysFile, "api-keys-file", "", `file of API keys, one per line ('#' comments); when set, every API call needs "Authorization: Bearer KEY" (gRPC: the authorization metadata)`)
	fs.StringVar(&l.chatTemplateFile, "chat-template-file", "", "Jinja chat template to use instead of the model's tokenizer.chat_template")
}

func (l *limitFlags) validate(maxNewDefault int) error {
	switch {
	case l.maxPromptTokens < 0:
		return fmt.Errorf("--max-prompt-tokens: %d, want ≥ 0", l.maxPromptTokens)
	case l.maxNewTokens < 0:
		return fmt.Errorf("--max-new-tokens-limit: %d, want ≥ 0", l.maxNewTokens)
	case l.maxNewTokens > 0 && maxNewDefault > l.maxNewTokens:
		return fmt.Errorf("--max-new-tokens %d exceeds --max-new-tokens-limit %d", maxNewDefault, l.maxNewTokens)
	case l.maxConcurrent < 0:
		return fmt.Errorf("--max-concurrent-requests: %d, want ≥ 0", l.maxConcurrent)
	case l.requestTimeout < 0:
		return fmt.Errorf("--request-timeout: %v, want ≥ 0", l.requestTimeout)
	case l.clientWriteTimeout < 0:
		return fmt.Errorf("--client-write-timeout: %v, want ≥ 0", l.clientWriteTimeout)
	case l.maxBodyBytes < 1024:
		return fmt.Errorf("--max-body-bytes: %d, want ≥ 1024", l.maxBodyBytes)
	}
	return nil
}

// openAPI loads the API keys and the chat template (Open's part for the
// OpenAI API).
func (s *Service) openAPI(log *slog.Logger) error {
	if p := s.limits.apiKeysFile; p != "" {
		keys, err := openai.LoadKeys(p)
		if err != nil {
			return fmt.Errorf("--api-keys-file: %w", err)
		}
		s.keys = keys
		log.Info("authentication on", "keys", keys.Len())
	}
	var src string
	if p := s.limits.chatTemplateFile; p != "" {
		b, err := os.ReadFile(p)
		if err != nil {
			return fmt.Errorf("--chat-template-file: %w", err)
		}
		src = string(b)
	}
	t, err := openai.ChatTemplateFor(s.tok, src)
	if err != nil {
		if src != "" {
			return fmt.Errorf("--chat-template-file %s: %w", s.limits.chatTemplateFile, err)
		}
		return fmt.Errorf("--model %s: %w (pass --chat-template-file to replace it)", s.Model.Path, err)
	}
	s.chatTemplate = t
	return nil
}

// registerOpenAI mounts the OpenAI-compatible API, which runs requests
// through run like the gRPC API.
func (s *Service) registerOpenAI(srv *svckit.Server) error {
	mi := s.ModelInfo()
	h, err := openai.New(openai.GeneratorFunc(s.run), openai.Options{
		Model: openai.Model{ID: s.modelID, Created: mi.GetCreated(), OwnedBy: mi.GetOwnedBy(), Architecture: s.cfg.Architecture,
			Fingerprint: s.fingerprint, ContextLength: s.cfg.ContextLength, Tokenizer: s.tok},
		Limits: openai.Limits{MaxBodyBytes: s.limits.maxBodyBytes, MaxPromptTokens: s.limits.maxPromptTokens,
			DefaultMaxTokens: s.maxNewTokens, MaxNewTokens: s.limits.maxNewTokens,
			WriteTimeout: s.limits.clientWriteTimeout},
		Template: s.chatTemplate,
		Keys:     s.keys,
		Logger:   s.logger,
	})
	if err != nil {
		return err
	}
	h.Register(srv.Mux)
	return nil
}

// ndjson is the gateway's JSON marshaler, labelling streams (POST
// /v1/generate) as newline-delimited JSON: one {"result": ...} or
// {"error": ...} object per line.
type ndjson struct{ *runtime.JSONPb }

// StreamContentType implements runtime.StreamContentType.
func (ndjson) StreamContentType(any) string { return "application/x-ndjson" }

// gatewayError is grpc-gateway's error answer plus the headers OpenAI
// clients also get: Retry-After when busy, WWW-Authenticate without a key.
func gatewayError(ctx context.Context, mux *runtime.ServeMux, m runtime.Marshaler, w http.ResponseWriter, r *http.Request, err error) {
	var st interface{ GRPCStatus() *status.Status }
	if errors.As(err, &st) {
		switch st.GRPCStatus().Code() {
		case codes.ResourceExhausted, codes.Unavailable:
			w.Header().Set("Retry-After", strconv.Itoa(openai.RetryAfterSeconds))
		case codes.Unauthenticated:
			w.Header().Set("WWW-Authenticate", `Bearer realm="baton"`)
		}
	}
	runtime.DefaultHTTPErrorHandler(ctx, mux, m, w, r, err)
}
