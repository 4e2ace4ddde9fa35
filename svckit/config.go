package svckit

import (
	"flag"
	"fmt"
	"math"
	"net"
	"strconv"
	"time"

	"github.com/baton-serving/baton/svckit/tlsconf"
)

// Config is the configuration every service shares.
type Config struct {
	GRPCAddr        string
	HTTPAddr        string
	LogLevel        string
	LogFormat       string
	ShutdownTimeout time.Duration
	// TLS is --tls-cert, --tls-key and --tls-ca: mutual TLS between router,
	// prefill and decode (package tlsconf). Workers serve gRPC with it and
	// every service dials workers with it; the router's own listeners stay
	// plain (clients use API keys; TLS for clients is the ingress's).
	TLS tlsconf.Files
	// Pprof serves net/http/pprof's profiles under /debug/pprof/ on the
	// admin listener.
	Pprof bool

	// AdminAddr is the admin listener (admin.go): /debug/* and pprof, and
	// /metrics when MetricsOnAdmin. "" or "off" serves none of them.
	AdminAddr string
	// MetricsOnAdmin serves /metrics on the admin listener instead of the
	// HTTP port.
	MetricsOnAdmin bool
	// HTTPBodyTimeout bounds reading one request body (0: DefaultHTTPBodyTimeout).
	HTTPBodyTimeout time.Duration
	// GRPCReflection registers gRPC server reflection on the gRPC port.
	GRPCReflection bool
	// GRPCMaxConcurrentStreams bounds the streams one client connection may
	// hold open (0: DefaultGRPCMaxConcurrentStreams).
	GRPCMaxConcurrentStreams uint
	// GRPCKeepaliveTime and GRPCKeepaliveTimeout are how long a connection
	// may be silent before it is pinged, and how long the ping's answer may
	// take before the connection is closed, on the server's connections and
	// on the ones the service dials (0: the defaults).
	GRPCKeepaliveTime    time.Duration
	GRPCKeepaliveTimeout time.Duration
	// GRPCKeepaliveMinTime is the shortest interval between a client's pings
	// that the server accepts; a client pinging more often is disconnected
	// (0: DefaultGRPCKeepaliveMinTime).
	GRPCKeepaliveMinTime time.Duration
}

// Defaults of the listener and connection settings, used when a Config
// leaves them zero.
const (
	DefaultHTTPBodyTimeout          = 30 * time.Second
	DefaultGRPCMaxConcurrentStreams = 1024
	DefaultGRPCKeepaliveTime        = 30 * time.Second
	DefaultGRPCKeepaliveTimeout     = 10 * time.Second
	DefaultGRPCKeepaliveMinTime     = 5 * time.Second
)

// AdminOff is the --admin-addr value that disables the admin listener.
const AdminOff = "off"

// AdminEnabled reports whether the admin listener is on.
func (c *Config) AdminEnabled() bool { return c.AdminAddr != "" && c.AdminAddr != AdminOff }

// AddFlags registers the shared flags on fs, with d's values as defaults.
func (c *Config) AddFlags(fs *flag.FlagSet, d Config) {
	fs.StringVar(&c.GRPCAddr, "grpc-addr", d.GRPCAddr, "gRPC listen address (host:port)")
	fs.StringVar(&c.HTTPAddr, "http-addr", d.HTTPAddr, "HTTP listen address for /metrics, /health, /health/ready (host:port)")
	fs.StringVar(&c.LogLevel, "log-level", orDefault(d.LogLevel, "info"), "log level: debug, info, warn or error")
	fs.StringVar(&c.LogFormat, "log-format", orDefault(d.LogFormat, "json"), "log format: json or text")
	fs.DurationVar(&c.ShutdownTimeout, "shutdown-timeout", orDuration(d.ShutdownTimeout, 10*time.Second),
		"on SIGTERM, how long in-flight requests get to finish before they are aborted")
	fs.StringVar(&c.TLS.Cert, "tls-cert", d.TLS.Cert, "PEM certificate for mutual TLS between router, prefill and decode; it names the service's role as a URI SAN spiffe://baton/<router|prefill|decode> (batonctl certs writes them); with --tls-key and --tls-ca, all three or none")
	fs.StringVar(&c.TLS.Key, "tls-key", d.TLS.Key, "PEM private key of --tls-cert")
	fs.StringVar(&c.TLS.CA, "tls-ca", d.TLS.CA, "PEM CA certificate(s) that peers' certificates must be signed by")
	fs.BoolVar(&c.Pprof, "pprof", d.Pprof, "serve Go's CPU, heap, goroutine and mutex profiles under /debug/pprof/ on the admin listener (--admin-addr)")
	fs.StringVar(&c.AdminAddr, "admin-addr", d.AdminAddr, `admin listen address (host:port) for /debug/requests, /debug/* and /debug/pprof/ (and /metrics with --metrics-on-admin); keep it on loopback or a private network: it lists request ids, client addresses and trace ids ("off": no admin listener)`)
	fs.BoolVar(&c.MetricsOnAdmin, "metrics-on-admin", d.MetricsOnAdmin, "serve /metrics on the admin listener instead of the HTTP port")
	fs.DurationVar(&c.HTTPBodyTimeout, "http-body-timeout", orDuration(d.HTTPBodyTimeout, DefaultHTTPBodyTimeout),
		"longest an HTTP client may take to send a request body; a slower upload is cut off (the request fails with 408 or 400)")
	fs.BoolVar(&c.GRPCReflection, "grpc-reflection", d.GRPCReflection, "serve gRPC server reflection on the gRPC port (for grpcurl; it lists every service to anyone who reaches the port)")
	fs.UintVar(&c.GRPCMaxConcurrentStreams, "grpc-max-concurrent-streams", orUint(d.GRPCMaxConcurrentStreams, DefaultGRPCMaxConcurrentStreams),
		"most gRPC streams one client connection may have open at once; more wait for one to end")
	fs.DurationVar(&c.GRPCKeepaliveTime, "grpc-keepalive-time", orDuration(d.GRPCKeepaliveTime, DefaultGRPCKeepaliveTime),
		"a gRPC connection (served or dialled) silent this long is pinged, so a half-open peer is noticed (dialled connections ping at most every 10s)")
	fs.DurationVar(&c.GRPCKeepaliveTimeout, "grpc-keepalive-timeout", orDuration(d.GRPCKeepaliveTimeout, DefaultGRPCKeepaliveTimeout),
		"how long a keepalive ping's answer may take before the connection is closed and its RPCs fail")
	fs.DurationVar(&c.GRPCKeepaliveMinTime, "grpc-keepalive-min-time", orDuration(d.GRPCKeepaliveMinTime, DefaultGRPCKeepaliveMinTime),
		"shortest interval between a client's keepalive pings the gRPC server accepts; a client pinging more often is disconnected. Must not exceed --grpc-keepalive-time here, nor that of any service that dials this one")
}

// Validate checks the shared flags; errors name the flag.
func (c *Config) Validate() error {
	if err := ValidateAddr(c.GRPCAddr); err != nil {
		return fmt.Errorf("--grpc-addr: %w", err)
	}
	if err := ValidateAddr(c.HTTPAddr); err != nil {
		return fmt.Errorf("--http-addr: %w", err)
	}
	if c.ShutdownTimeout <= 0 {
		return fmt.Errorf("--shutdown-timeout: must be positive, got %v", c.ShutdownTimeout)
	}
	if err := c.TLS.Validate(); err != nil {
		return err
	}
	if c.AdminEnabled() {
		if err := ValidateAddr(c.AdminAddr); err != nil {
			return fmt.Errorf("--admin-addr: %w (or %q)", err, AdminOff)
		}
	}
	if c.MetricsOnAdmin && !c.AdminEnabled() {
		return fmt.Errorf("--metrics-on-admin: needs --admin-addr")
	}
	if c.Pprof && !c.AdminEnabled() {
		return fmt.Errorf("--pprof: needs --admin-addr (the profiles are served only on the admin listener)")
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"--http-body-timeout", c.HTTPBodyTimeout}, {"--grpc-keepalive-time", c.GRPCKeepaliveTime},
		{"--grpc-keepalive-timeout", c.GRPCKeepaliveTimeout}, {"--grpc-keepalive-min-time", c.GRPCKeepaliveMinTime}} {
		if d.v < 0 {
			return fmt.Errorf("%s: must not be negative, got %v", d.name, d.v)
		}
	}
	if c.GRPCMaxConcurrentStreams > math.MaxUint32 {
		return fmt.Errorf("--grpc-max-concurrent-streams: %d, want ≤ %d", c.GRPCMaxConcurrentStreams, uint32(math.MaxUint32))
	}
	if c.GRPCKeepaliveTime > 0 && c.GRPCKeepaliveTime < time.Second {
		return fmt.Errorf("--grpc-keepalive-time: %v, want ≥ 1s", c.GRPCKeepaliveTime)
	}
	// A server refusing pings more frequent than its own clients' would
	// GOAWAY them with too_many_pings, killing healthy long streams. The
	// services share these flags, so each one's min-time must not exceed
	// its own ping interval (and, in a deployment, any dialler's).
	if kt, mt := orDuration(c.GRPCKeepaliveTime, DefaultGRPCKeepaliveTime), orDuration(c.GRPCKeepaliveMinTime, DefaultGRPCKeepaliveMinTime); mt > kt {
		return fmt.Errorf("--grpc-keepalive-min-time: %v exceeds --grpc-keepalive-time %v; it must not exceed the --grpc-keepalive-time of any service that dials this one, or their pings get its connections closed (too_many_pings)", mt, kt)
	}
	return nil
}

// ValidateAddr checks that addr is host:port with a numeric port in 0-65535.
func ValidateAddr(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("address %q: want host:port", addr)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 0 || p > 65535 {
		return fmt.Errorf("address %q: port %q is not a number in 0-65535", addr, port)
	}
	return nil
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

func orUint(v, d uint) uint {
	if v == 0 {
		return d
	}
	return v
}

func orDuration(v, d time.Duration) time.Duration {
	if v == 0 {
		return d
	}
	return v
}
