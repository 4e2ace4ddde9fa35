package decode

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/baton-serving/baton/svckit"
	"google.golang.org/grpc"
)

// Decode dials the prefill worker each request names (prefill_endpoint,
// chosen by the router). Left open, that lets any caller of
// DecodeService.Generate make decode connect anywhere and keep the
// connection for ever. So decode dials only endpoints --prefill-allow
// admits, closes a connection no transfer has used for
// --prefill-idle-timeout, and keeps at most --max-prefill-conns of them.

// errPrefillNotAllowed: a request names a prefill endpoint that
// --prefill-allow does not admit. UNAVAILABLE (svckit.ErrPeerNotAllowed),
// not INVALID_ARGUMENT: the router chose the endpoint, not the client, so a
// deployment whose prefill addresses fall outside the list is the pair's
// failure — the router fails over, and a client sees 503, not 400.
var errPrefillNotAllowed = fmt.Errorf("%w: not allowed by --prefill-allow", svckit.ErrPeerNotAllowed)

// errTooManyPeers: every one of the --max-prefill-conns connections is in use
// by a transfer, so none can make way for a new endpoint.
var errTooManyPeers = errors.New("all prefill connections are in use (--max-prefill-conns)")

// peerLimits are decode's flags on the prefill workers it connects to.
type peerLimits struct {
	allowSpec string        // --prefill-allow
	idle      time.Duration // --prefill-idle-timeout
	max       int           // --max-prefill-conns
	allow     []allowRule   // allowSpec parsed (validate); empty: any endpoint
}

func (l *peerLimits) addFlags(fs *flag.FlagSet) {
	fs.StringVar(&l.allowSpec, "prefill-allow", "", "comma-separated prefill endpoints decode may connect to: host:port, host (any port), *.domain[:port] (names under domain), an IP prefix such as 10.0.0.0/8 or 10.0.0.0/8:8082 (IP endpoints within it), or * (any); empty allows any endpoint, with a warning at start-up (see docs/reliability.md)")
	fs.DurationVar(&l.idle, "prefill-idle-timeout", 5*time.Minute, "close a connection to a prefill worker once no transfer has used it for this long")
	fs.IntVar(&l.max, "max-prefill-conns", 64, "most connections to prefill workers kept at once; a request naming a new prefill worker when all are in use is refused (UNAVAILABLE)")
}

// validate parses --prefill-allow and checks the other limits.
func (l *peerLimits) validate() error {
	if l.idle <= 0 {
		return errors.New("--prefill-idle-timeout: want > 0")
	}
	if l.max < 1 {
		return errors.New("--max-prefill-conns: want ≥ 1")
	}
	rules, err := parseAllow(l.allowSpec)
	if err != nil {
		return fmt.Errorf("--prefill-allow: %w", err)
	}
	l.allow = rules
	return nil
}

// warn says at start-up that any endpoint is allowed, when it is.
func (l *peerLimits) warn(log *slog.Logger) {
	if len(l.allow) == 0 {
		log.Warn("--prefill-allow is empty: decode connects to any prefill endpoint a request names; list the prefill workers' addresses to restrict it")
	}
}

// allowed is the one check of a prefill endpoint (host:port) against
// --prefill-allow: nil if decode may connect to it, else an error naming
// the field that wraps errPrefillNotAllowed.
func (l *peerLimits) allowed(endpoint string) error {
	if len(l.allow) == 0 {
		return nil
	}
	host, port, err := net.SplitHostPort(endpoint)
	if err == nil && slices.ContainsFunc(l.allow, func(r allowRule) bool { return r.match(host, port) }) {
		return nil
	}
	return fmt.Errorf("prefill_endpoint %q: %w", endpoint, errPrefillNotAllowed)
}

// allowRule is one --prefill-allow pattern.
type allowRule struct {
	any    bool
	host   string       // exact host (lower case), or the domain of a *.domain pattern
	suffix bool         // host is a domain: names under it match
	prefix netip.Prefix // valid: IP endpoints within it match (names never do)
	port   string       // "" any
}

// parseAllow parses a comma-separated --prefill-allow list.
func parseAllow(spec string) ([]allowRule, error) {
	var rules []allowRule
	for _, p := range strings.Split(spec, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		r, err := parseRule(p)
		if err != nil {
			return nil, err
		}
		rules = append(rules, r)
	}
	return rules, nil
}

func parseRule(p string) (allowRule, error) {
	if p == "*" {
		return allowRule{any: true}, nil
	}
	if pre, err := netip.ParsePrefix(p); err == nil {
		return allowRule{prefix: pre.Masked()}, nil
	}
	if i := strings.LastIndex(p, ":"); i > 0 {
		if pre, err := netip.ParsePrefix(strings.Trim(p[:i], "[]")); err == nil {
			if !validPort(p[i+1:]) {
				return allowRule{}, fmt.Errorf("%q: bad port", p)
			}
			return allowRule{prefix: pre.Masked(), port: p[i+1:]}, nil
		}
	}
	host, port := p, ""
	if h, pt, err := net.SplitHostPort(p); err == nil {
		host, port = h, pt
		if !validPort(port) {
			return allowRule{}, fmt.Errorf("%q: bad port", p)
		}
	} else if strings.Count(p, ":") == 1 {
		return allowRule{}, fmt.Errorf("%q: want host:port, host, *.domain[:port], an IP prefix or *", p)
	}
	host = strings.ToLower(strings.Trim(host, "[]"))
	r := allowRule{host: host, port: port}
	if d, ok := strings.CutPrefix(host, "*."); ok {
		r.host, r.suffix = d, true
	}
	if r.host == "" || strings.ContainsAny(r.host, "*/ ") {
		return allowRule{}, fmt.Errorf("%q: want host:port, host, *.domain[:port], an IP prefix or *", p)
	}
	return r, nil
}

func validPort(p string) bool {
	if p == "" || len(p) > 5 {
		return false
	}
	n := 0
	for _, c := range p {
		if c < '0' || c > '9' {
			return false
		}
		n = n*10 + int(c-'0')
	}
	return n > 0 && n < 1<<16
}

// match reports whether the endpoint host:port is allowed by r. IP
// prefixes match IP endpoints only: a name is not resolved, since what
// gRPC later dials could differ from what a check resolved.
func (r allowRule) match(host, port string) bool {
	switch {
	case r.any:
		return true
	case r.port != "" && r.port != port:
		return false
	case r.prefix.IsValid():
		ip, err := netip.ParseAddr(host)
		return err == nil && r.prefix.Contains(ip.Unmap())
	case r.suffix:
		return strings.HasSuffix(strings.ToLower(host), "."+r.host)
	default:
		return strings.ToLower(host) == r.host
	}
}

// peerPool keeps one connection per prefill endpoint: at most max of them,
// each closed once idle (no transfer using it) for idle.
type peerPool struct {
	opts  []grpc.DialOption
	check func(endpoint string) error // the allow check
	idle  time.Duration
	max   int

	mu     sync.Mutex
	conns  map[string]*peer
	closed bool
}

// peer is one kept connection.
type peer struct {
	conn  *grpc.ClientConn
	users int         // transfers using it
	gen   uint64      // bumped on each use, so a stale idle timer does nothing
	idle  *time.Timer // runs while users == 0
	last  time.Time   // when it was last released
}

func newPeerPool(limits peerLimits, opts ...grpc.DialOption) *peerPool {
	return &peerPool{opts: opts, check: limits.allowed, idle: limits.idle, max: max(limits.max, 1), conns: map[string]*peer{}}
}

// get returns a connection to addr for one transfer, dialing it if need be,
// and the release to call once the transfer is over. A new endpoint takes
// the place of the connection idle longest when the pool is full; if every
// connection is in use, get fails with errTooManyPeers.
func (p *peerPool) get(addr string) (*grpc.ClientConn, func(), error) {
	if err := p.check(addr); err != nil {
		return nil, nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, nil, errors.New("decode is shutting down")
	}
	pe, ok := p.conns[addr]
	if !ok {
		if len(p.conns) >= p.max && !p.evictLocked() {
			return nil, nil, fmt.Errorf("%w: %d connections", errTooManyPeers, len(p.conns))
		}
		c, err := grpc.NewClient(addr, p.opts...)
		if err != nil {
			return nil, nil, err
		}
		pe = &peer{conn: c}
		p.conns[addr] = pe
	}
	pe.users++
	pe.gen++
	if pe.idle != nil {
		pe.idle.Stop()
		pe.idle = nil
	}
	var once sync.Once
	return pe.conn, func() { once.Do(func() { p.release(addr, pe) }) }, nil
}

// release ends one transfer's use of pe; the last one starts its idle timer.
func (p *peerPool) release(addr string, pe *peer) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if pe.users--; pe.users > 0 || p.conns[addr] != pe {
		return
	}
	gen := pe.gen
	pe.last = time.Now()
	pe.idle = time.AfterFunc(p.idle, func() { p.expire(addr, pe, gen) })
}

// expire closes pe if it is still idle since the release that set the timer.
func (p *peerPool) expire(addr string, pe *peer, gen uint64) {
	p.mu.Lock()
	if p.conns[addr] != pe || pe.users > 0 || pe.gen != gen {
		p.mu.Unlock()
		return
	}
	delete(p.conns, addr)
	p.mu.Unlock()
	_ = pe.conn.Close()
}

// evictLocked closes the connection idle longest, if any is idle.
func (p *peerPool) evictLocked() bool {
	var victim string
	var oldest *peer
	for a, pe := range p.conns {
		if pe.users == 0 && (oldest == nil || pe.last.Before(oldest.last)) {
			victim, oldest = a, pe
		}
	}
	if oldest == nil {
		return false
	}
	if oldest.idle != nil {
		oldest.idle.Stop()
	}
	delete(p.conns, victim)
	// Closing an idle connection does not block on the network.
	_ = oldest.conn.Close()
	return true
}

// size is the number of connections kept.
func (p *peerPool) size() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

func (p *peerPool) close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	var errs []error
	for a, pe := range p.conns {
		if pe.idle != nil {
			pe.idle.Stop()
		}
		errs = append(errs, pe.conn.Close())
		delete(p.conns, a)
	}
	return errors.Join(errs...)
}
