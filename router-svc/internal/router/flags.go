package router

// The router's flag groups: request limits and API options (limitFlags);
// discovery, routing-limit and canary flags (fleetFlags). Service.AddFlags
// and Service.Validate, in router.go, register and check them with the
// router's other flags. The limits apply to every API: they are enforced in
// run and prepare, which gRPC, REST and OpenAI requests all go through.

import (
	"flag"
	"fmt"
	"time"

	"github.com/baton-serving/baton/router-svc/internal/openai"
	"github.com/baton-serving/baton/svckit"
	"github.com/baton-serving/baton/svckit/apiconv"
)

// limitFlags are the router's request limits and API options.
type limitFlags struct {
	maxPromptTokens    int
	maxNewTokens       int
	maxN               int
	maxConcurrent      int
	maxPerClient       int
	requestTimeout     time.Duration
	clientWriteTimeout time.Duration
	maxBodyBytes       int64
	apiKeysFile        string
	chatTemplateFile   string
	corsOrigins        string
	openaiLenient      bool
	cors               *openai.CORS // set by validate; nil: CORS off
}

// Defaults of the limit flags.
const (
	defaultMaxConcurrent = 256
	// defaultMaxPerClient is half of defaultMaxConcurrent: one client
	// address can never take every slot.
	defaultMaxPerClient   = 128
	defaultRequestTimeout = 10 * time.Minute
	defaultMaxBodyBytes   = 4 << 20
)

func (l *limitFlags) addFlags(fs *flag.FlagSet) {
	fs.IntVar(&l.maxPromptTokens, "max-prompt-tokens", 0, "longest prompt accepted, in tokens (0: up to the context window less one)")
	fs.IntVar(&l.maxNewTokens, "max-new-tokens-limit", 0, "most tokens one request may ask to generate (0: up to the context window)")
	fs.IntVar(&l.maxN, "max-n", apiconv.DefaultMaxN, "most continuations one request may ask for (sampling.n, the OpenAI API's n); more are refused with INVALID_ARGUMENT / HTTP 400 naming n")
	fs.IntVar(&l.maxConcurrent, "max-concurrent-requests", defaultMaxConcurrent, "requests run at once over all APIs; more are refused with RESOURCE_EXHAUSTED / HTTP 429 and Retry-After (0: no limit)")
	fs.IntVar(&l.maxPerClient, "max-inflight-per-client", defaultMaxPerClient, "requests one client address (host, any port; a REST client's own, not the gateway's) may have in flight at once over all APIs; more are refused with RESOURCE_EXHAUSTED / HTTP 429 and Retry-After (0: no cap; set 0 or raise it behind a proxy that hides client addresses)")
	fs.DurationVar(&l.requestTimeout, "request-timeout", defaultRequestTimeout, "longest a request may run, arrival to last token; it travels to the workers as the gRPC deadline (0: no limit)")
	fs.DurationVar(&l.clientWriteTimeout, "client-write-timeout", 30*time.Second, "minimum progress of a streaming client (gRPC, REST, SSE): every event must be taken by the client within this long of the router having it, or the request is aborted with DEADLINE_EXCEEDED and releases everything it holds — a client that takes nothing, or drips and falls behind (0: only --request-timeout bounds it)")
	fs.Int64Var(&l.maxBodyBytes, "max-body-bytes", defaultMaxBodyBytes, "largest HTTP request body (REST and OpenAI APIs); larger ones get 413")
	fs.StringVar(&l.apiKeysFile, "api-keys-file", "", `file of API keys, one per line ('#' comments); when set, every API call needs "Authorization: Bearer KEY" (gRPC: the authorization metadata)`)
	fs.StringVar(&l.chatTemplateFile, "chat-template-file", "", "Jinja chat template to use instead of the model's tokenizer.chat_template")
	fs.BoolVar(&l.openaiLenient, "openai-lenient", false, "OpenAI API: log and ignore request fields Baton does not know instead of refusing them with 400 'Unrecognized request argument supplied: NAME' (default: strict, as OpenAI is)")
	fs.StringVar(&l.corsOrigins, "cors-allowed-origins", "", `origins whose web pages may call the HTTP APIs (OpenAI and REST) from a browser: a comma-separated list of exact origins (https://app.example.com,http://localhost:3000) or "*"; their answers get CORS headers and their preflights (OPTIONS) are answered 204 without a key; other origins get no CORS headers and 403 on preflight; never on the admin listener (default none: no CORS)`)
}

func (l *limitFlags) validate(maxNewDefault int) error {
	if err := apiconv.CheckMaxN(l.maxN); err != nil {
		return err
	}
	switch {
	case l.maxPromptTokens < 0:
		return fmt.Errorf("--max-prompt-tokens: %d, want ≥ 0", l.maxPromptTokens)
	case l.maxNewTokens < 0:
		return fmt.Errorf("--max-new-tokens-limit: %d, want ≥ 0", l.maxNewTokens)
	case l.maxNewTokens > 0 && maxNewDefault > l.maxNewTokens:
		return fmt.Errorf("--max-new-tokens %d exceeds --max-new-tokens-limit %d", maxNewDefault, l.maxNewTokens)
	case l.maxConcurrent < 0:
		return fmt.Errorf("--max-concurrent-requests: %d, want ≥ 0", l.maxConcurrent)
	case l.maxPerClient < 0:
		return fmt.Errorf("--max-inflight-per-client: %d, want ≥ 0", l.maxPerClient)
	case l.requestTimeout < 0:
		return fmt.Errorf("--request-timeout: %v, want ≥ 0", l.requestTimeout)
	case l.clientWriteTimeout < 0:
		return fmt.Errorf("--client-write-timeout: %v, want ≥ 0", l.clientWriteTimeout)
	case l.maxBodyBytes < 1024:
		return fmt.Errorf("--max-body-bytes: %d, want ≥ 1024", l.maxBodyBytes)
	}
	var err error
	if l.cors, err = openai.ParseCORSOrigins(l.corsOrigins); err != nil {
		return fmt.Errorf("--cors-allowed-origins: %w", err)
	}
	return nil
}

// fleetFlags are the router's discovery, routing-limit and canary flags.
type fleetFlags struct {
	resolveInterval time.Duration
	dnsServer       string
	maxInflight     int
	canaryInterval  time.Duration
	canaryTimeout   time.Duration
}

func (f *fleetFlags) addFlags(fs *flag.FlagSet) {
	fs.DurationVar(&f.resolveInterval, "resolve-interval", 5*time.Second, "how often dns:/// worker targets are resolved again; workers that appear are checked and watched, workers that vanish are drained")
	fs.StringVar(&f.dnsServer, "dns-server", "", "DNS server (host:port) for dns:/// worker targets (default: the system's resolver)")
	fs.IntVar(&f.maxInflight, "max-inflight-per-worker", 0, "requests the router runs at once on one worker; when every candidate worker is full a request is refused with RESOURCE_EXHAUSTED / HTTP 429 (0: no limit)")
	fs.DurationVar(&f.canaryInterval, "canary-interval", 15*time.Second, "how often a tiny real request (a real KV transfer) is sent through each passing (prefill, decode) pair; failing pairs are routed around and probed again sooner, and readiness needs one passing pair (0: no canary)")
	fs.DurationVar(&f.canaryTimeout, "canary-timeout", 5*time.Second, "deadline of one canary request; a pair slower than this is quarantined")
}

func (f *fleetFlags) validate() error {
	switch {
	case f.resolveInterval < 100*time.Millisecond:
		return fmt.Errorf("--resolve-interval: %v, want ≥ 100ms", f.resolveInterval)
	case f.maxInflight < 0:
		return fmt.Errorf("--max-inflight-per-worker: %d, want ≥ 0", f.maxInflight)
	case f.canaryInterval < 0:
		return fmt.Errorf("--canary-interval: %v, want ≥ 0 (0 turns the canary off)", f.canaryInterval)
	case f.canaryInterval > 0 && f.canaryInterval < 100*time.Millisecond:
		return fmt.Errorf("--canary-interval: %v, want 0 or ≥ 100ms", f.canaryInterval)
	case f.canaryTimeout <= 0:
		return fmt.Errorf("--canary-timeout: %v, want > 0", f.canaryTimeout)
	}
	if f.dnsServer != "" {
		if err := svckit.ValidateAddr(f.dnsServer); err != nil {
			return fmt.Errorf("--dns-server: %w", err)
		}
	}
	return nil
}
