// Package certs implements `batonctl certs`: it writes a development CA
// and a certificate and key for each of router, prefill and decode, for
// the services' --tls-cert, --tls-key and --tls-ca (mutual TLS between
// them; see docs/deploy.md). For production, issue certificates from your
// own CA with the same role URI SANs.
package certs

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/baton-serving/baton/svckit"
	"github.com/baton-serving/baton/svckit/tlsconf"
)

// Summary is the one-line description of the command.
const Summary = "write a development CA and router, prefill and decode certificates for mutual TLS"

// Run is the `batonctl certs` command.
func Run(_ context.Context, stdout, stderr io.Writer, args []string) int {
	var out, hosts string
	var validity time.Duration
	fs := flag.NewFlagSet("batonctl certs", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&out, "out", "", "directory to write ca.crt, ca.key and router.crt/.key, prefill.crt/.key, decode.crt/.key into (created; existing files are replaced)")
	fs.StringVar(&hosts, "host", "", "comma-separated DNS names or IP addresses added to every certificate's SANs, besides localhost, 127.0.0.1 and ::1")
	fs.DurationVar(&validity, "validity", 365*24*time.Hour, "how long the certificates are valid")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: batonctl certs --out DIR [flags]\n\n"+
			"Writes a development CA and one ECDSA P-256 certificate and key per role (router, prefill,\n"+
			"decode), each naming its role as the URI SAN spiffe://baton/<role>. Start each service with\n"+
			"--tls-cert DIR/<role>.crt --tls-key DIR/<role>.key --tls-ca DIR/ca.crt.\n\nFlags:")
		fs.PrintDefaults()
	}
	if err := svckit.ParseFlags(fs, args, nil); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "batonctl certs: %v\n", err)
		return 2
	}
	if out == "" {
		fmt.Fprintln(stderr, "batonctl certs: --out: required (the directory to write the certificates into)")
		return 2
	}
	if validity <= 0 {
		fmt.Fprintf(stderr, "batonctl certs: --validity %v: must be positive\n", validity)
		return 2
	}
	var hs []string
	for _, h := range strings.Split(hosts, ",") {
		if h = strings.TrimSpace(h); h != "" {
			hs = append(hs, h)
		}
	}
	if err := tlsconf.WriteDevCerts(out, tlsconf.DevOptions{Hosts: hs, Validity: validity}); err != nil {
		fmt.Fprintf(stderr, "batonctl certs: --out %s: %v\n", out, err)
		return 1
	}
	fmt.Fprintf(stdout, "Wrote a development CA and router, prefill and decode certificates to %s (valid %v).\n", out, validity)
	for _, r := range tlsconf.Roles {
		f := tlsconf.FilesIn(out, r)
		fmt.Fprintf(stdout, "  %-8s --tls-cert %s --tls-key %s --tls-ca %s\n", r, f.Cert, f.Key, f.CA)
	}
	fmt.Fprintf(stdout, "Keep %s/ca.key private; it signs new certificates.\n", strings.TrimSuffix(out, "/"))
	return 0
}
