package certs

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/baton-serving/baton/svckit/tlsconf"
)

func TestCertsWritesLoadableRoleCertificates(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	var out, errb bytes.Buffer
	if code := Run(context.Background(), &out, &errb, []string{"--out", dir, "--host", "decode.baton.svc, 10.0.0.7"}); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for _, r := range tlsconf.Roles {
		id, err := tlsconf.Load(tlsconf.FilesIn(dir, r), nil)
		if err != nil {
			t.Fatalf("%s: %v", r, err)
		}
		if id.Role() != r {
			t.Fatalf("%s.crt names role %s", r, id.Role())
		}
		if !strings.Contains(out.String(), "--tls-cert "+tlsconf.FilesIn(dir, r).Cert) {
			t.Errorf("output does not show %s's flags:\n%s", r, out.String())
		}
	}
}

func TestCertsFlagErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "--out: required"},
		{[]string{"--out", t.TempDir(), "--validity", "-1h"}, "--validity -1h0m0s: must be positive"},
	} {
		var out, errb bytes.Buffer
		if code := Run(context.Background(), &out, &errb, c.args); code != 2 || !strings.Contains(errb.String(), c.want) {
			t.Errorf("%v: exit %d, %q; want 2 and %q", c.args, code, errb.String(), c.want)
		}
	}
}
