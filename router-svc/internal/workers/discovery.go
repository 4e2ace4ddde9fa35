package workers

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Source says where a role's workers are. The Set asks it again on every
// resolve interval.
type Source interface {
	// Resolve returns the workers' addresses (host:port), sorted. An error
	// means "unknown now": the set keeps its workers. A definite empty
	// answer removes them all.
	Resolve(ctx context.Context) ([]string, error)
	// String describes the source for logs.
	String() string
}

// Static is a fixed list of addresses.
type Static []string

// Resolve returns the list, sorted.
func (s Static) Resolve(context.Context) ([]string, error) {
	out := slices.Clone(s)
	slices.Sort(out)
	return slices.Compact(out), nil
}

func (s Static) String() string { return strings.Join(s, ",") }

// DNSScheme starts a target resolved through DNS: dns:///NAME:PORT, or
// dns://SERVER/NAME:PORT to ask SERVER (host:port) instead of the system's
// resolver.
const DNSScheme = "dns://"

// DNS resolves every A and AAAA record of Name; each address, with Port, is
// a worker. In Kubernetes Name is a headless Service, whose records are its
// ready pods.
type DNS struct {
	Name string
	Port int
	// Server is the DNS server (host:port) to ask; "" is the system's
	// resolver.
	Server   string
	resolver *net.Resolver
}

// NewDNS returns a DNS source for name and port asking server ("" for the
// system's resolver).
func NewDNS(name string, port int, server string) *DNS {
	d := &DNS{Name: name, Port: port, Server: server, resolver: net.DefaultResolver}
	if server != "" {
		dialer := &net.Dialer{Timeout: 2 * time.Second}
		d.resolver = &net.Resolver{
			PreferGo: true,
			Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
				return dialer.DialContext(ctx, network, server)
			},
		}
	}
	return d
}

// Resolve looks the name up. A name that does not exist, or has no
// addresses, is a definite empty answer (a headless Service scaled to zero);
// any other failure is an error.
func (d *DNS) Resolve(ctx context.Context) ([]string, error) {
	ips, err := d.resolver.LookupIPAddr(ctx, d.Name)
	if err != nil {
		var de *net.DNSError
		if errors.As(err, &de) && de.IsNotFound {
			return nil, nil
		}
		return nil, fmt.Errorf("resolving %s: %w", d.Name, err)
	}
	port := strconv.Itoa(d.Port)
	out := make([]string, 0, len(ips))
	for _, ip := range ips {
		out = append(out, net.JoinHostPort(ip.IP.String(), port))
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

func (d *DNS) String() string {
	s := DNSScheme + d.Server + "/" + net.JoinHostPort(d.Name, strconv.Itoa(d.Port))
	return s
}

// ParseTarget parses a --prefill or --decode value: a comma-separated list
// of host:port, or dns:///NAME:PORT (dns://SERVER/NAME:PORT names the DNS
// server). dnsServer, when not "", is the DNS server for a dns:/// target
// that names none.
func ParseTarget(v, dnsServer string) (Source, error) {
	v = strings.TrimSpace(v)
	if rest, ok := strings.CutPrefix(v, DNSScheme); ok {
		server, hostport, ok := strings.Cut(rest, "/")
		if !ok {
			return nil, fmt.Errorf("%q: want dns:///NAME:PORT or dns://SERVER/NAME:PORT", v)
		}
		if server == "" {
			server = dnsServer
		}
		if server != "" {
			if err := checkHostPort(server); err != nil {
				return nil, fmt.Errorf("%q: DNS server: %w", v, err)
			}
		}
		host, port, err := splitHostPort(hostport)
		if err != nil {
			return nil, fmt.Errorf("%q: %w", v, err)
		}
		return NewDNS(host, port, server), nil
	}
	if strings.Contains(v, "://") {
		return nil, fmt.Errorf("%q: the only scheme understood is dns:///NAME:PORT", v)
	}
	var out Static
	for _, a := range strings.Split(v, ",") {
		a = strings.TrimSpace(a)
		if a == "" {
			continue
		}
		if err := checkHostPort(a); err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	if len(out) == 0 {
		return nil, errors.New("at least one host:port (or dns:///NAME:PORT) is required")
	}
	return out, nil
}

func checkHostPort(a string) error {
	_, _, err := splitHostPort(a)
	return err
}

func splitHostPort(a string) (string, int, error) {
	host, p, err := net.SplitHostPort(a)
	if err != nil {
		return "", 0, fmt.Errorf("address %q: want host:port", a)
	}
	if host == "" {
		return "", 0, fmt.Errorf("address %q: no host", a)
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 1 || port > 65535 {
		return "", 0, fmt.Errorf("address %q: port %q, want 1-65535", a, p)
	}
	return host, port, nil
}
