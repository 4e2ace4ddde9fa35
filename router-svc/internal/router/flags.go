package router

// The router's own flag groups: discovery, routing-limit and canary flags
// (fleetFlags). Service.AddFlags and Service.Validate, in router.go,
// register and check them with the router's other flags.

import (
	"flag"
	"fmt"
	"time"

	"github.com/baton-serving/baton/svckit"
)

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
