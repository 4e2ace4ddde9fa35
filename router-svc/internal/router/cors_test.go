package router

import (
	"flag"
	"strings"
	"testing"

	"github.com/baton-serving/baton/svckit"
)

// TestCORSFlag: --cors-allowed-origins (or BATON_CORS_ALLOWED_ORIGINS) is
// checked at startup; an error names the flag and the bad entry.
func TestCORSFlag(t *testing.T) {
	for _, c := range []struct {
		args []string
		env  string
		want string // "" for valid
	}{
		{nil, "", ""},
		{[]string{"--cors-allowed-origins", "https://app.example.com,http://localhost:3000"}, "", ""},
		{[]string{"--cors-allowed-origins", "*"}, "", ""},
		{[]string{"--cors-allowed-origins", "https://app.example.com/path"}, "", `--cors-allowed-origins: "https://app.example.com/path"`},
		{nil, "https://ok.example,ftp//bad", `--cors-allowed-origins: "ftp//bad"`},
	} {
		s := New()
		fs := flag.NewFlagSet("router", flag.ContinueOnError)
		s.AddFlags(fs)
		env := func(k string) (string, bool) {
			if k == "BATON_CORS_ALLOWED_ORIGINS" && c.env != "" {
				return c.env, true
			}
			return "", false
		}
		if err := svckit.ParseFlags(fs, c.args, env); err != nil {
			t.Fatal(err)
		}
		err := s.Validate()
		if (c.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%v env %q: %v, want %q", c.args, c.env, err, c.want)
		}
	}
}
