package up

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/baton-serving/baton/svckit/tlsconf"
)

// TestWriteCerts: --tls gives each service its own role's certificate, key
// and the shared CA, from files that load as that role.
func TestWriteCerts(t *testing.T) {
	if args, err := writeCerts(false, t.TempDir(), &bytes.Buffer{}); err != nil || args != nil {
		t.Fatalf("without --tls: %v %v, want no arguments", args, err)
	}
	logDir := t.TempDir()
	var stderr bytes.Buffer
	args, err := writeCerts(true, logDir, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	for bin, role := range map[string]tlsconf.Role{"router-svc": tlsconf.Router, "prefill-svc": tlsconf.Prefill, "decode-svc": tlsconf.Decode} {
		a := args[bin]
		i, j, k := slices.Index(a, "--tls-cert"), slices.Index(a, "--tls-key"), slices.Index(a, "--tls-ca")
		if len(a) != 6 || i < 0 || j < 0 || k < 0 {
			t.Fatalf("%s: args %q", bin, a)
		}
		f := tlsconf.Files{Cert: a[i+1], Key: a[j+1], CA: a[k+1]}
		if filepath.Dir(f.Cert) != filepath.Join(logDir, "certs") {
			t.Errorf("%s: certificate %s not in the log directory's certs/", bin, f.Cert)
		}
		id, err := tlsconf.Load(f, nil)
		if err != nil {
			t.Fatalf("%s: %v", bin, err)
		}
		if id.Role() != role {
			t.Errorf("%s gets a certificate of role %s, want %s", bin, id.Role(), role)
		}
	}
	if !bytes.Contains(stderr.Bytes(), []byte("mutual TLS on")) {
		t.Errorf("stderr %q does not say TLS is on", stderr.String())
	}
	// Logs on stderr ("-" gives logDir ""): the certificates go to a new
	// temporary directory.
	args, err = writeCerts(true, "", &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tlsconf.Load(tlsconf.Files{Cert: args["decode-svc"][1], Key: args["decode-svc"][3], CA: args["decode-svc"][5]}, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(filepath.Dir(args["decode-svc"][1])) })
}
