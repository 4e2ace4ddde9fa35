package svckit

import (
	"flag"
	"fmt"
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
	// HTTP port.
	Pprof bool
}

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
	fs.BoolVar(&c.Pprof, "pprof", d.Pprof, "serve Go's CPU, heap, goroutine and mutex profiles under /debug/pprof/ on the HTTP port (anyone who reaches the port can read them)")
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

func orDuration(v, d time.Duration) time.Duration {
	if v == 0 {
		return d
	}
	return v
}
