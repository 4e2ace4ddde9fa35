package router

// The router's OpenAI-compatible API (package openai): its keys and chat
// template at Open, its handler on the HTTP mux at Register.

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"github.com/baton-serving/baton/router-svc/internal/openai"
	"github.com/baton-serving/baton/svckit"
)

// openAPI loads the API keys and the chat template (Open's part for the
// OpenAI API).
func (s *Service) openAPI(log *slog.Logger) error {
	if p := s.limits.apiKeysFile; p != "" {
		keys, err := openai.LoadKeys(p)
		if err != nil {
			return fmt.Errorf("--api-keys-file: %w", err)
		}
		log.Info("authentication on", "keys", keys.Len())
		// The self-probe authenticates as a client would, with a key
		// only this process knows.
		if s.keys, err = keys.With(s.selfProbeToken); err != nil {
			return fmt.Errorf("self-probe key: %w", err)
		}
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
	// Tool calls are parsed in the syntax of the family the template's
	// markers tell; an unknown one falls back to the generic JSON form,
	// and a template that does not show tools gets a generic preamble —
	// both worth seeing when a model's calls go unrecognised.
	level := slog.LevelInfo
	if t.ToolFamily() == "generic" || !t.RendersTools() {
		level = slog.LevelWarn
	}
	log.Log(context.Background(), level, "chat template: tool calls", "family", t.ToolFamily(),
		"template_renders_tools", t.RendersTools(), "custom_template", src != "")
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
			WriteTimeout: s.limits.clientWriteTimeout, RequestTimeout: s.limits.requestTimeout, MaxN: s.limits.maxN},
		Template: s.chatTemplate,
		Keys:     s.keys,
		Logger:   s.logger,
		Refused:  s.metrics.refused,
		Admits:   true, // run calls openai.Admitted once admitted
		Lenient:  s.limits.openaiLenient,
		// Computed once, at Open (it walks the vocabulary).
		MaxTokenBytes: s.maxTokenBytes,
	})
	if err != nil {
		return err
	}
	h.Register(srv.Mux)
	return nil
}
