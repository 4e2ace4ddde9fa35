package modelfile

import (
	"context"
	"errors"
	"strings"
	"testing"
)

func TestParseRef(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Ref
		url  string
	}{
		{"hf://acme/tiny/m.gguf", Ref{"acme", "tiny", "main", "m.gguf"}, "https://hub.test/acme/tiny/resolve/main/m.gguf"},
		{"hf://TheBloke/Llama-2-7B-GGUF/llama-2-7b.Q4_K_M.gguf", Ref{"TheBloke", "Llama-2-7B-GGUF", "main", "llama-2-7b.Q4_K_M.gguf"}, ""},
		{"hf://a_b/c.d@v1.0/sub/dir/M.GGUF", Ref{"a_b", "c.d", "v1.0", "sub/dir/M.GGUF"}, "https://hub.test/a_b/c.d/resolve/v1.0/sub/dir/M.GGUF"},
		{"hf://o/r@0123abc/x y+z.gguf", Ref{"o", "r", "0123abc", "x y+z.gguf"}, "https://hub.test/o/r/resolve/0123abc/x%20y+z.gguf"},
		{"hf://o/r/.hidden/a..b.gguf", Ref{"o", "r", "main", ".hidden/a..b.gguf"}, ""},
	} {
		got, err := ParseRef(tc.in)
		if err != nil {
			t.Errorf("ParseRef(%q): %v", tc.in, err)
			continue
		}
		if got != tc.want {
			t.Errorf("ParseRef(%q) = %+v, want %+v", tc.in, got, tc.want)
		}
		if tc.url != "" {
			if u := got.URL("https://hub.test/"); u != tc.url {
				t.Errorf("ParseRef(%q).URL = %q, want %q", tc.in, u, tc.url)
			}
		}
		if again, err := ParseRef(got.String()); err != nil || again != got {
			t.Errorf("ParseRef(%q.String() = %q) = %+v, %v; want a round trip", tc.in, got.String(), again, err)
		}
	}
}

func TestParseRefRejects(t *testing.T) {
	for _, tc := range []struct {
		in      string
		wantMsg string // the error must name the bad part
	}{
		{"hf://", `owner "": empty`},
		{"hf://acme", "missing the repository"},
		{"hf://acme/tiny", "missing the file"},
		{"hf://acme/tiny/", `segment 1 "": empty`},
		{"hf:///tiny/m.gguf", `owner "": empty`},
		{"hf://acme//m.gguf", `repository "": empty`},
		{"hf://acme/tiny//m.gguf", `segment 1 "": empty`},
		{"hf://acme/tiny/a//m.gguf", `segment 2 "": empty`},
		{"hf://acme/tiny/../m.gguf", `segment 1 "..": ".." not allowed`},
		{"hf://acme/tiny/a/./m.gguf", `segment 2 ".": "." not allowed`},
		{"hf://../tiny/m.gguf", `owner ".."`},
		{"hf://acme/..@main/m.gguf", `repository ".."`},
		{"hf://acme/ti..ny/m.gguf", `repository "ti..ny": contains ".."`},
		{"hf://-acme/tiny/m.gguf", `owner "-acme": starts or ends`},
		{"hf://acme/tiny./m.gguf", `repository "tiny.": starts or ends`},
		{"hf://ac me/tiny/m.gguf", `owner "ac me": character ' '`},
		{"hf://acme/ti~ny/m.gguf", `repository "ti~ny": character '~'`},
		{"hf://acme/" + strings.Repeat("r", 97) + "/m.gguf", "longer than 96"},
		{"hf://acme/tiny@/m.gguf", `revision "": empty`},
		{"hf://acme/tiny@a..b/m.gguf", `revision "a..b": contains ".."`},
		{"hf://acme/tiny@-x/m.gguf", `revision "-x": starts with`},
		{"hf://acme/tiny@x@y/m.gguf", `revision "x@y": character '@'`},
		{"hf://acme/tiny/m.bin", `file "m.bin": not a .gguf`},
		{"hf://acme/tiny/m.gguf/", `segment 2 "": empty`},
		{"hf://acme/tiny/.gguf", `file ".gguf": not a .gguf`},
		{"hf://acme/tiny/m.gguf.partial", `file "m.gguf.partial"`},
		{"hf://acme/tiny/a\\b.gguf", `character '\\'`},
		{"hf://acme/tiny/a?b.gguf", `character '?'`},
		{"hf://acme/tiny/a%2fb.gguf", `character '%'`},
		{"hf://acme/tiny/a\x00b.gguf", `character '\x00'`},
		{"hf://acme/tiny/a\xffb.gguf", `character '�'`},
		{"huggingface://acme/tiny/m.gguf", "want hf://"},
	} {
		_, err := ParseRef(tc.in)
		if !errors.Is(err, ErrInvalidRef) {
			t.Errorf("ParseRef(%q) error = %v, want ErrInvalidRef", tc.in, err)
			continue
		}
		if !strings.Contains(err.Error(), tc.wantMsg) {
			t.Errorf("ParseRef(%q) error = %q, want it to contain %q", tc.in, err, tc.wantMsg)
		}
		// Resolve must refuse them without touching the cache or network.
		if !strings.HasPrefix(tc.in, "hf://") {
			continue
		}
		cache := t.TempDir()
		_, rerr := Resolve(context.Background(), tc.in, Options{CacheDir: cache, BaseURL: "http://127.0.0.1:1"})
		if !errors.Is(rerr, ErrInvalidRef) {
			t.Errorf("Resolve(%q) error = %v, want ErrInvalidRef", tc.in, rerr)
		}
	}
}
