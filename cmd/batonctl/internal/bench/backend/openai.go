package backend

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
)

// OpenAI calls the router's OpenAI-compatible API over HTTP/1.1, reusing
// keep-alive connections as OpenAI's SDKs do.
type OpenAI struct {
	base   string // scheme://host:port[/prefix], no trailing slash
	apiKey string
	client *http.Client
	model  string // set by Model, sent with every request
}

// NewOpenAI prepares a client of the API at addr: host:port (http is
// assumed) or a base URL. maxConns bounds the idle connections kept for
// reuse; set it to the benchmark's concurrency.
func NewOpenAI(addr, apiKey string, maxConns int) (*OpenAI, error) {
	base := strings.TrimRight(addr, "/")
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	if !strings.HasPrefix(base, "http://") && !strings.HasPrefix(base, "https://") {
		return nil, fmt.Errorf("router %q: want host:port or an http(s) URL", addr)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns = 0
	tr.MaxIdleConnsPerHost = max(maxConns, 2)
	return &OpenAI{base: base, apiKey: apiKey, client: &http.Client{Transport: tr}}, nil
}

func (o *OpenAI) newRequest(ctx context.Context, method, path string, body []byte) (*http.Request, error) {
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, o.base+path, r)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if o.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+o.apiKey)
	}
	return req, nil
}

// Model implements Backend with GET /v1/models.
func (o *OpenAI) Model(ctx context.Context) (Model, error) {
	req, err := o.newRequest(ctx, http.MethodGet, "/v1/models", nil)
	if err != nil {
		return Model{}, err
	}
	resp, err := o.client.Do(req)
	if err != nil {
		return Model{}, fmt.Errorf("router %s: %w", o.base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return Model{}, fmt.Errorf("router %s: GET /v1/models: %w", o.base, httpErr(resp))
	}
	var list struct {
		Data []struct {
			ID            string `json:"id"`
			VocabSize     int    `json:"vocab_size"`
			ContextLength int    `json:"context_length"`
			Fingerprint   string `json:"fingerprint"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		return Model{}, fmt.Errorf("router %s: GET /v1/models: %w", o.base, err)
	}
	if len(list.Data) == 0 {
		return Model{}, fmt.Errorf("router %s serves no model", o.base)
	}
	m := list.Data[0]
	o.model = m.ID
	return Model{ID: m.ID, VocabSize: m.VocabSize, ContextLength: m.ContextLength, Fingerprint: m.Fingerprint}, nil
}

type completionBody struct {
	Model         string   `json:"model,omitempty"`
	Prompt        []uint32 `json:"prompt"`
	MaxTokens     int      `json:"max_tokens"`
	Temperature   float64  `json:"temperature"`
	Seed          int64    `json:"seed"`
	IgnoreEOS     bool     `json:"ignore_eos,omitempty"`
	Stream        bool     `json:"stream"`
	StreamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

type completionChunk struct {
	Choices []struct {
		Text         string  `json:"text"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	// Timings is llama-server's own report: cache_n counts the prompt
	// tokens its prompt cache reused, prompt_n those it computed (older
	// versions report only prompt_n).
	Timings *struct {
		CacheN  *int `json:"cache_n"`
		PromptN *int `json:"prompt_n"`
	} `json:"timings"`
	Error *apiError `json:"error"`
}

type apiError struct {
	Message string `json:"message"`
	Type    string `json:"type"`
	Code    any    `json:"code"`
}

// Generate implements Backend with a streamed POST /v1/completions (the
// seed travels as the API's signed integer, its top bit dropped). Every
// chunk with text is a chunk of output; the API does not say how many
// tokens it holds, so token counts come from the final usage chunk.
func (o *OpenAI) Generate(ctx context.Context, req Request, onChunk OnChunk) (Result, error) {
	ids, err := wireIDs(req.PromptIDs)
	if err != nil {
		return Result{}, err
	}
	b := completionBody{Model: o.model, Prompt: ids, MaxTokens: req.MaxTokens, Temperature: req.Temperature,
		Seed: int64(req.Seed & math.MaxInt64), IgnoreEOS: req.IgnoreEOS, Stream: true}
	b.StreamOptions.IncludeUsage = true
	body, err := json.Marshal(b)
	if err != nil {
		return Result{}, err
	}
	hreq, err := o.newRequest(ctx, http.MethodPost, "/v1/completions", body)
	if err != nil {
		return Result{}, err
	}
	hreq.Header.Set("Accept", "text/event-stream")
	// A kept-alive connection that the server closed while it sat idle
	// (llama-server closes them after a few seconds) fails the next
	// request before the server read it ("broken pipe", or EOF before any
	// response). A completion the server never saw is safe to send again:
	// marking the request idempotent lets net/http retry it on a new
	// connection in exactly that case. A nil value is not sent on the wire.
	hreq.Header["Idempotency-Key"] = nil
	resp, err := o.client.Do(hreq)
	if err != nil {
		return Result{}, errors.New(oneLine(err.Error()))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return Result{}, httpErr(resp)
	}
	var (
		res             Result
		chunks          int
		done            bool
		finished        bool
		cacheN, promptN = -1, -1
	)
	err = readSSE(resp.Body, func(data []byte) error {
		if string(data) == "[DONE]" {
			done = true
			return errStop
		}
		var c completionChunk
		if err := json.Unmarshal(data, &c); err != nil {
			return fmt.Errorf("bad event %.80q: %w", data, err)
		}
		if c.Error != nil {
			return fmt.Errorf("stream error: %s", oneLine(c.Error.Message))
		}
		text := false
		for _, ch := range c.Choices {
			text = text || ch.Text != ""
			if ch.FinishReason != nil {
				finished, res.FinishReason = true, *ch.FinishReason
			}
		}
		if text {
			chunks++
			onChunk(0)
		}
		if c.Usage != nil {
			res.InputTokens, res.OutputTokens = c.Usage.PromptTokens, c.Usage.CompletionTokens
			if d := c.Usage.PromptTokensDetails; d != nil {
				res.CachedTokens = d.CachedTokens
			}
		}
		if c.Timings != nil {
			if c.Timings.CacheN != nil {
				cacheN = *c.Timings.CacheN
			}
			if c.Timings.PromptN != nil {
				promptN = *c.Timings.PromptN
			}
		}
		return nil
	})
	switch {
	case err != nil:
		return res, err
	case !done:
		return res, errors.New("stream ended without [DONE]")
	case !finished:
		return res, errors.New("stream ended without a finish reason")
	}
	if res.InputTokens == 0 {
		res.InputTokens = len(ids)
	}
	switch {
	case res.CachedTokens > 0:
	case cacheN >= 0:
		res.CachedTokens = cacheN
	case promptN >= 0 && promptN < res.InputTokens:
		res.CachedTokens = res.InputTokens - promptN
	}
	if res.OutputTokens == 0 {
		// No usage chunk: the chunk count is the best estimate there is.
		res.OutputTokens = chunks
	}
	return res, nil
}

// Close implements Backend.
func (o *OpenAI) Close() error {
	o.client.CloseIdleConnections()
	return nil
}

// errStop ends readSSE early without an error.
var errStop = errors.New("stop")

// readSSE calls event with the data of each server-sent event (data lines
// joined by newlines) until the stream ends or event returns an error.
func readSSE(r io.Reader, event func(data []byte) error) error {
	br := bufio.NewReaderSize(r, 64<<10)
	var data []byte
	have := false
	for {
		line, err := br.ReadBytes('\n')
		if len(line) > 0 {
			line = bytes.TrimRight(line, "\r\n")
			switch {
			case len(line) == 0:
				if have {
					if e := event(data); e != nil {
						if errors.Is(e, errStop) {
							return nil
						}
						return e
					}
				}
				data, have = data[:0], false
			case bytes.HasPrefix(line, []byte("data:")):
				v := bytes.TrimPrefix(line[len("data:"):], []byte(" "))
				if have {
					data = append(data, '\n')
				}
				data, have = append(data, v...), true
			}
			// Comments (":…") and other fields (event, id, retry) are
			// not used by the API.
		}
		if errors.Is(err, io.EOF) {
			if have {
				if e := event(data); e != nil && !errors.Is(e, errStop) {
					return e
				}
			}
			return nil
		}
		if err != nil {
			return errors.New(oneLine("reading the stream: " + err.Error()))
		}
	}
}

// httpErr describes a refused request by its status and the API's message.
func httpErr(resp *http.Response) error {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var e struct {
		Error apiError `json:"error"`
	}
	msg := strings.TrimSpace(string(body))
	if json.Unmarshal(body, &e) == nil && e.Error.Message != "" {
		msg = e.Error.Message
	}
	return errors.New(oneLine(fmt.Sprintf("http %d: %s", resp.StatusCode, msg)))
}
