package manifest

import (
	"strings"
	"testing"
)

const help = `decode-svc — Baton decode worker

Usage: decode-svc [flags]

Flags (each can also be set by the environment variable shown):
  -grpc-addr string
    	gRPC listen address (host:port) [$BATON_GRPC_ADDR] (default "127.0.0.1:8084")
  -kv-cache-bytes value
    	memory for KV cache pages, in bytes or with a unit (512MiB, 4GiB) [$BATON_KV_CACHE_BYTES] (default 1073741824)
  -model string
    	GGUF model: a local path or hf://OWNER/REPO/FILE.gguf (default: ../shared/models/stories260K.gguf when it exists) [$BATON_MODEL]
  -shutdown-timeout duration
    	on SIGTERM, how long in-flight requests get to finish
    	before they are aborted [$BATON_SHUTDOWN_TIMEOUT] (default 10s)
  -verbose
    	log more [$BATON_VERBOSE]
`

func TestParseHelp(t *testing.T) {
	fs, err := ParseHelp(help)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]Flag{
		"grpc-addr":        {"grpc-addr", "string", "127.0.0.1:8084", "BATON_GRPC_ADDR"},
		"kv-cache-bytes":   {"kv-cache-bytes", "value", "1073741824", "BATON_KV_CACHE_BYTES"},
		"model":            {"model", "string", "", "BATON_MODEL"},
		"shutdown-timeout": {"shutdown-timeout", "duration", "10s", "BATON_SHUTDOWN_TIMEOUT"},
		"verbose":          {"verbose", "bool", "", "BATON_VERBOSE"},
	}
	if len(fs) != len(want) {
		t.Errorf("parsed %d flags, want %d: %v", len(fs), len(want), fs)
	}
	for name, w := range want {
		if fs[name] != w {
			t.Errorf("%s = %+v, want %+v", name, fs[name], w)
		}
	}
	if f, ok := fs.ByEnv("BATON_MODEL"); !ok || f.Name != "model" {
		t.Errorf("ByEnv(BATON_MODEL) = %v, %v", f, ok)
	}
}

func TestParseHelpRejects(t *testing.T) {
	for name, text := range map[string]string{
		"no flags":         "usage: x\n",
		"no variable":      "  -grpc-addr string\n    \tlisten address\n",
		"another variable": "  -grpc-addr string\n    \tlisten address [$GRPC_ADDR]\n",
	} {
		if _, err := ParseHelp(text); err == nil {
			t.Errorf("%s: parsed without an error", name)
		}
	}
}

func TestParseArgs(t *testing.T) {
	fs, err := ParseHelp(help)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		args    []string
		want    map[string]string
		wantErr string
	}{
		{[]string{"--grpc-addr", ":1", "-model=/m.gguf", "--verbose"}, map[string]string{"grpc-addr": ":1", "model": "/m.gguf", "verbose": "true"}, ""},
		{[]string{"--grpc-addr=:1", "--grpc-addr=:2"}, map[string]string{"grpc-addr": ":2"}, ""},
		{[]string{"--grpcaddr=:1"}, nil, "no flag --grpcaddr"},
		{[]string{"serve"}, nil, "not a flag"},
		{[]string{"--model"}, nil, "needs a value"},
	}
	for _, tc := range tests {
		got, err := ParseArgs(fs, tc.args)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%q: error %v, want %q", tc.args, err, tc.wantErr)
			}
			continue
		}
		if err != nil || len(got) != len(tc.want) {
			t.Errorf("%q: %v, %v; want %v", tc.args, got, err, tc.want)
			continue
		}
		for k, v := range tc.want {
			if got[k] != v {
				t.Errorf("%q: %s = %q, want %q", tc.args, k, got[k], v)
			}
		}
	}
}

func TestListenPort(t *testing.T) {
	tests := []struct {
		addr    string
		want    int32
		wantErr string
	}{
		{":8082", 8082, ""},
		{"0.0.0.0:80", 80, ""},
		{"[::]:9000", 9000, ""},
		{"127.0.0.1:8082", 0, "loopback"},
		{"localhost:8082", 0, "loopback"},
		{"[::1]:8082", 0, "loopback"},
		{"8082", 0, "missing port"},
		{":0", 0, "1-65535"},
		{":http", 0, "1-65535"},
	}
	for _, tc := range tests {
		got, err := ListenPort(tc.addr)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ListenPort(%q) error = %v, want %q", tc.addr, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ListenPort(%q) = %d, %v; want %d", tc.addr, got, err, tc.want)
		}
	}
}

func TestParseByteSize(t *testing.T) {
	tests := []struct {
		in   string
		want int64
	}{
		{"1073741824", 1 << 30}, {"1GiB", 1 << 30}, {"512MiB", 512 << 20}, {"1.5GiB", 3 << 29},
		{"100MB", 100e6}, {"2KiB", 2048}, {"4 GiB", 4 << 30}, {"7B", 7},
	}
	for _, tc := range tests {
		if got, err := ParseByteSize(tc.in); err != nil || got != tc.want {
			t.Errorf("ParseByteSize(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "0", "-1GiB", "1Gi", "GiB", "1e300GiB", "lots"} {
		if got, err := ParseByteSize(bad); err == nil {
			t.Errorf("ParseByteSize(%q) = %d, want an error", bad, got)
		}
	}
}

func TestImageName(t *testing.T) {
	for ref, want := range map[string]string{
		"baton/router-svc:dev":                         "router-svc",
		"registry.example:5000/team/decode-svc:v1.2":   "decode-svc",
		"prefill-svc":                                  "prefill-svc",
		"ghcr.io/x/prefill-svc@sha256:0123456789abcd":  "prefill-svc",
		"ghcr.io/x/prefill-svc:v1@sha256:0123456789ab": "prefill-svc",
	} {
		if got := imageName(ref); got != want {
			t.Errorf("imageName(%q) = %q, want %q", ref, got, want)
		}
	}
}
