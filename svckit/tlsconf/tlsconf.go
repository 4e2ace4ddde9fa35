// Package tlsconf is Baton's mutual TLS between router, prefill and decode:
// it loads a service's certificate, key and CA (--tls-cert, --tls-key,
// --tls-ca), builds gRPC server credentials that require and verify a
// client certificate and client credentials that present one, and checks
// each peer's role from its certificate.
//
// A certificate names its role in exactly one URI SAN,
// spiffe://baton/<role> (router, prefill or decode), the SPIFFE convention
// for workload identity. Peers are identified by role, not host name: a
// worker's certificate is valid for whatever pod IP it gets, so Baton's
// clients verify the chain against the CA and the role, never the address
// they dialed. The certificates batonctl certs writes also carry
// localhost, 127.0.0.1 and ::1 (and --host names) as DNS/IP SANs so that
// ordinary tools (grpcurl --cacert) can verify them too.
//
// A wrong role is refused after the handshake, per method, with
// PERMISSION_DENIED "peer certificate role prefill, want router": a clear
// message rather than a TLS alert. A client without a certificate, or with
// one the CA did not sign, fails the handshake.
//
// Files are re-read when they change (checked at most once a second, at a
// handshake), so a rotated Kubernetes Secret takes effect without a
// restart; a change that does not load keeps the old identity and is
// logged.
package tlsconf

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// Role is a Baton service's role, as its certificate names it.
type Role string

// The roles.
const (
	Router  Role = "router"
	Prefill Role = "prefill"
	Decode  Role = "decode"
)

// Roles lists every role.
var Roles = []Role{Router, Prefill, Decode}

// TrustDomain is the host part of the role URI spiffe://baton/<role>.
const TrustDomain = "baton"

// Errors. They are wrapped with details (%w); svckit's error table maps
// them to UNAUTHENTICATED (ErrNoCertificate) and PERMISSION_DENIED.
var (
	ErrNoCertificate = errors.New("no peer certificate")
	ErrNoRole        = errors.New("certificate names no Baton role")
	ErrWrongRole     = errors.New("wrong peer role")
)

// URI is the URI SAN that names role r: spiffe://baton/<r>.
func (r Role) URI() *url.URL {
	return &url.URL{Scheme: "spiffe", Host: TrustDomain, Path: "/" + string(r)}
}

// Valid reports whether r is one of Roles.
func (r Role) Valid() bool { return slices.Contains(Roles, r) }

// RoleOf returns the role cert names. It must name exactly one.
func RoleOf(cert *x509.Certificate) (Role, error) {
	var found []Role
	for _, u := range cert.URIs {
		if u.Scheme == "spiffe" && u.Host == TrustDomain {
			found = append(found, Role(strings.TrimPrefix(u.Path, "/")))
		}
	}
	switch {
	case len(found) == 0:
		return "", fmt.Errorf("%w (want a URI SAN spiffe://%s/<router|prefill|decode>)", ErrNoRole, TrustDomain)
	case len(found) > 1:
		return "", fmt.Errorf("%w: it names %d roles %v, want one", ErrNoRole, len(found), found)
	case !found[0].Valid():
		return "", fmt.Errorf("%w: unknown role %q", ErrNoRole, found[0])
	}
	return found[0], nil
}

// checkRole returns an error unless cert's role is one of want.
func checkRole(who string, cert *x509.Certificate, want []Role) (Role, error) {
	got, err := RoleOf(cert)
	if err != nil {
		return "", fmt.Errorf("%s certificate: %w", who, err)
	}
	if !slices.Contains(want, got) {
		return got, fmt.Errorf("%w: %s certificate role %s, want %s", ErrWrongRole, who, got, joinRoles(want))
	}
	return got, nil
}

func joinRoles(rs []Role) string {
	s := make([]string, len(rs))
	for i, r := range rs {
		s[i] = string(r)
	}
	return strings.Join(s, " or ")
}

// Files are the three PEM files of an identity: --tls-cert, --tls-key and
// --tls-ca. All three or none.
type Files struct {
	Cert, Key, CA string
}

// Enabled reports whether TLS is configured.
func (f Files) Enabled() bool { return f.Cert != "" || f.Key != "" || f.CA != "" }

// Validate checks that all three are set or none; the error names the
// missing flags.
func (f Files) Validate() error {
	if !f.Enabled() {
		return nil
	}
	var missing []string
	for _, m := range []struct{ flag, v string }{{"--tls-cert", f.Cert}, {"--tls-key", f.Key}, {"--tls-ca", f.CA}} {
		if m.v == "" {
			missing = append(missing, m.flag)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%s: --tls-cert, --tls-key and --tls-ca go together (all three or none); missing %s",
			missing[0], strings.Join(missing, ", "))
	}
	return nil
}

// reloadEvery bounds how often the files' modification times are checked.
const reloadEvery = time.Second

// Identity is a loaded certificate, key and CA pool, re-read when the
// files change. Safe for concurrent use.
type Identity struct {
	files  Files
	logger *slog.Logger
	every  time.Duration

	mu      sync.Mutex
	cur     *loaded
	checked time.Time
	// refused are the modification times of files last refused for naming
	// another role: they are not loaded (nor the refusal logged) again
	// until one of them changes.
	refused [3]time.Time
}

type loaded struct {
	cert  tls.Certificate
	pool  *x509.CertPool
	role  Role
	mtime [3]time.Time
}

// Load reads f; errors name the flag whose file is at fault. logger gets
// reload failures (nil: discarded).
func Load(f Files, logger *slog.Logger) (*Identity, error) {
	if err := f.Validate(); err != nil {
		return nil, err
	}
	if !f.Enabled() {
		return nil, errors.New("tlsconf.Load: no files configured")
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	l, err := load(f)
	if err != nil {
		return nil, err
	}
	return &Identity{files: f, logger: logger, every: reloadEvery, cur: l, checked: time.Now()}, nil
}

func load(f Files) (*loaded, error) {
	var l loaded
	for i, p := range []struct{ flag, path string }{{"--tls-cert", f.Cert}, {"--tls-key", f.Key}, {"--tls-ca", f.CA}} {
		st, err := os.Stat(p.path)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", p.flag, p.path, err)
		}
		l.mtime[i] = st.ModTime()
	}
	certPEM, err := os.ReadFile(f.Cert)
	if err != nil {
		return nil, fmt.Errorf("--tls-cert %s: %w", f.Cert, err)
	}
	keyPEM, err := os.ReadFile(f.Key)
	if err != nil {
		return nil, fmt.Errorf("--tls-key %s: %w", f.Key, err)
	}
	caPEM, err := os.ReadFile(f.CA)
	if err != nil {
		return nil, fmt.Errorf("--tls-ca %s: %w", f.CA, err)
	}
	if l.cert, err = tls.X509KeyPair(certPEM, keyPEM); err != nil {
		return nil, fmt.Errorf("--tls-cert %s with --tls-key %s: %w", f.Cert, f.Key, err)
	}
	if l.role, err = RoleOf(l.cert.Leaf); err != nil {
		return nil, fmt.Errorf("--tls-cert %s: %w", f.Cert, err)
	}
	l.pool = x509.NewCertPool()
	if !l.pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("--tls-ca %s: no PEM certificate in it", f.CA)
	}
	// The service's own certificate must verify against the CA it gives
	// its peers: a mismatch would only show later as every peer refusing.
	if _, err := l.cert.Leaf.Verify(x509.VerifyOptions{Roots: l.pool, Intermediates: intermediates(l.cert.Certificate[1:]),
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return nil, fmt.Errorf("--tls-cert %s does not verify against --tls-ca %s: %w", f.Cert, f.CA, err)
	}
	return &l, nil
}

func intermediates(ders [][]byte) *x509.CertPool {
	p := x509.NewCertPool()
	for _, d := range ders {
		if c, err := x509.ParseCertificate(d); err == nil {
			p.AddCert(c)
		}
	}
	return p
}

// current returns the identity, re-reading the files if they changed.
func (id *Identity) current() *loaded {
	id.mu.Lock()
	defer id.mu.Unlock()
	if time.Since(id.checked) < id.every {
		return id.cur
	}
	id.checked = time.Now()
	changed := false
	var mtime [3]time.Time
	for i, p := range []string{id.files.Cert, id.files.Key, id.files.CA} {
		if st, err := os.Stat(p); err == nil {
			mtime[i] = st.ModTime()
			changed = changed || !mtime[i].Equal(id.cur.mtime[i])
		}
	}
	if !changed || sameTimes(mtime, id.refused) {
		return id.cur
	}
	l, err := load(id.files)
	if err != nil {
		// A Secret update writes the files one by one: the next check
		// retries, the old identity serves meanwhile.
		id.logger.Warn("TLS files changed but do not load; keeping the previous certificate", "err", err)
		return id.cur
	}
	if l.role != id.cur.role {
		// Logged once per change of the files, not at every check.
		id.refused = l.mtime
		id.logger.Warn("TLS certificate's role changed; keeping the previous certificate", "was", id.cur.role, "now", l.role)
		return id.cur
	}
	id.logger.Info("TLS certificate reloaded", "cert", id.files.Cert, "not_after", l.cert.Leaf.NotAfter)
	id.cur = l
	return l
}

// sameTimes reports whether a and b are the same modification times.
func sameTimes(a, b [3]time.Time) bool {
	for i := range a {
		if !a[i].Equal(b[i]) {
			return false
		}
	}
	return true
}

// Role is the role the service's own certificate names.
func (id *Identity) Role() Role { return id.current().role }

// ServerConfig requires a client certificate signed by the CA. Roles are
// checked per method by the interceptors of ServerOptions.
func (id *Identity) ServerConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			l := id.current()
			return &tls.Config{
				MinVersion:   tls.VersionTLS13,
				Certificates: []tls.Certificate{l.cert},
				ClientAuth:   tls.RequireAndVerifyClientCert,
				ClientCAs:    l.pool,
			}, nil
		},
	}
}

// ClientConfig presents the service's certificate and accepts a server
// whose certificate the CA signed and whose role is one of want. The
// address dialed is not checked: peers are identified by role (see the
// package doc).
func (id *Identity) ClientConfig(want ...Role) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			c := id.current().cert
			return &c, nil
		},
		// Verification is VerifyConnection's: against the current CA pool
		// and by role rather than host name.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return fmt.Errorf("server: %w", ErrNoCertificate)
			}
			leaf := cs.PeerCertificates[0]
			if _, err := leaf.Verify(x509.VerifyOptions{Roots: id.current().pool, Intermediates: certPool(cs.PeerCertificates[1:]),
				KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
				return fmt.Errorf("server certificate: %w", err)
			}
			if len(want) > 0 {
				if _, err := checkRole("server", leaf, want); err != nil {
					return err
				}
			}
			return nil
		},
	}
}

func certPool(cs []*x509.Certificate) *x509.CertPool {
	p := x509.NewCertPool()
	for _, c := range cs {
		p.AddCert(c)
	}
	return p
}

// DialOption is the gRPC client credentials for a server of one of the
// roles want.
func (id *Identity) DialOption(want ...Role) grpc.DialOption {
	return grpc.WithTransportCredentials(credentials.NewTLS(id.ClientConfig(want...)))
}

// Policy says which client roles may call a gRPC server's methods: keys are
// full service names ("baton.v1.PrefillService"); the "" key applies to
// services not listed. A service listed with no roles is open to any peer
// with a valid certificate.
type Policy map[string][]Role

// PolicyFor is the policy of a server of the given role: the router's
// canary, load watch and requests reach both workers; only decode pulls KV
// caches from prefill (PrefillService). Health checks are open to any
// certified peer. The router's own listeners are client-facing and take no
// certificates, so a router server has no policy (nil).
func PolicyFor(server Role) Policy {
	switch server {
	case Prefill:
		return Policy{"": {Router}, "baton.v1.PrefillService": {Decode}, "grpc.health.v1.Health": {}}
	case Decode:
		return Policy{"": {Router}, "grpc.health.v1.Health": {}}
	}
	return nil
}

// allowed returns the roles that may call fullMethod ("/pkg.Service/Method").
func (p Policy) allowed(fullMethod string) []Role {
	svc := strings.TrimPrefix(fullMethod, "/")
	if i := strings.LastIndexByte(svc, '/'); i >= 0 {
		svc = svc[:i]
	}
	if r, ok := p[svc]; ok {
		return r
	}
	return p[""]
}

// Authorize checks the role of ctx's peer against p for fullMethod.
func (p Policy) Authorize(ctx context.Context, fullMethod string) error {
	pr, ok := peer.FromContext(ctx)
	if !ok {
		return fmt.Errorf("%w: no peer in the context", ErrNoCertificate)
	}
	info, ok := pr.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return fmt.Errorf("%w: connection from %v is not mutual TLS", ErrNoCertificate, pr.Addr)
	}
	want := p.allowed(fullMethod)
	leaf := info.State.VerifiedChains[0][0]
	if len(want) == 0 {
		_, err := RoleOf(leaf)
		if err != nil {
			return fmt.Errorf("peer certificate: %w", err)
		}
		return nil
	}
	_, err := checkRole("peer", leaf, want)
	return err
}

// ServerOptions are a gRPC server's options for mutual TLS with id, each
// call authorized by p. toStatus turns Authorize's error (wrapping
// ErrNoCertificate, ErrNoRole or ErrWrongRole, prefixed with the method)
// into the gRPC status the caller gets: the service's one error-to-code
// table (svckit.Status) lives above this package.
func ServerOptions(id *Identity, p Policy, toStatus func(error) error) []grpc.ServerOption {
	deny := func(method string, err error) error { return toStatus(fmt.Errorf("%s: %w", method, err)) }
	return []grpc.ServerOption{
		grpc.Creds(credentials.NewTLS(id.ServerConfig())),
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if err := p.Authorize(ctx, info.FullMethod); err != nil {
				return nil, deny(info.FullMethod, err)
			}
			return h(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			if err := p.Authorize(ss.Context(), info.FullMethod); err != nil {
				return deny(info.FullMethod, err)
			}
			return h(srv, ss)
		}),
	}
}
