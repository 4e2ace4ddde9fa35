package diagnose

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseMetrics(t *testing.T) {
	in := `# HELP baton:num_running_reqs Requests decoding.
# TYPE baton:num_running_reqs gauge
baton:num_running_reqs 3
baton_request_aborts_total{reason="cancelled",stage="running"} 2
baton_request_aborts_total{reason="odd \"quoted\" } brace",stage="waiting"} 5
baton_step_seconds_bucket{le="+Inf"} 7
baton_kv_pages_leaked 0 1700000000000
go_goroutines   42
weird NaN
big 1e3
`
	got, err := parseMetrics(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{
		"baton:num_running_reqs": 3, "baton_request_aborts_total": 7, "baton_step_seconds_bucket": 7,
		"baton_kv_pages_leaked": 0, "go_goroutines": 42, "big": 1000,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %v\nwant %v", got, want)
	}
	for _, bad := range []string{"novalue\n", `x{a="b" 1` + "\n", "x 1 2 3\n", "x abc\n"} {
		if _, err := parseMetrics(strings.NewReader(bad)); err == nil {
			t.Errorf("parseMetrics(%q) accepted", bad)
		}
	}
}

func TestParseWorkers(t *testing.T) {
	cases := []struct {
		name string
		in   string
		want []discovered
		bad  bool
	}{
		{"list under workers, enum roles", `{"workers":[{"address":"10.0.0.1:8082","role":"WORKER_ROLE_PREFILL","ready":true},
			{"address":"10.0.0.2:8084","role":"WORKER_ROLE_DECODE","http_addr":"10.0.0.2:9000"}]}`,
			[]discovered{{RolePrefill, "10.0.0.1:8082", "", "", ""}, {RoleDecode, "10.0.0.2:8084", "http://10.0.0.2:9000", "", ""}}, false},
		{"top-level list, plain roles", `[{"role":"decode","grpc_addr":"a:1","http":"http://a:2"}]`,
			[]discovered{{RoleDecode, "a:1", "http://a:2", "", ""}}, false},
		{"per-role lists", `{"prefill":[{"addr":"p:1"}],"decode":[{"endpoint":"d:1"}],"canary":{"ok":true}}`,
			[]discovered{{RolePrefill, "p:1", "", "", ""}, {RoleDecode, "d:1", "", "", ""}}, false},
		{"the router's view: per-role sets, quarantine", `{"mode":"pd","canary":{"passing_pairs":1,"pairs":[]},
			"prefill":{"source":"static","workers":[{"address":"p:1","role":"prefill","ready":true,"quarantined":false}]},
			"decode":{"source":"static","workers":[{"address":"d:1","role":"decode","quarantined":true,"quarantine_reason":"p:1->d:1: deadline"},
				{"address":"d:2","role":"decode","quarantined":true}]}}`,
			[]discovered{{RolePrefill, "p:1", "", "", ""}, {RoleDecode, "d:1", "", "p:1->d:1: deadline", ""}, {RoleDecode, "d:2", "", "no reason given", ""}}, false},
		{"admin addresses", `{"decode":{"workers":[{"address":"d:1","role":"decode","http_addr":"d:2","admin_addr":"d:3"}]}}`,
			[]discovered{{RoleDecode, "d:1", "http://d:2", "", "http://d:3"}}, false},
		{"a remote worker's loopback admin is not ours to read", `{"decode":{"workers":[{"address":"10.1.1.1:1","role":"decode","admin_addr":"127.0.0.1:8088"},
			{"address":"127.0.0.1:1","role":"decode","admin_addr":"127.0.0.1:8088"}]}}`,
			[]discovered{{RoleDecode, "10.1.1.1:1", "", "", ""}, {RoleDecode, "127.0.0.1:1", "", "", "http://127.0.0.1:8088"}}, false},
		{"nothing usable", `{"workers":[{"role":"decode"}]}`, nil, true},
		{"not JSON", `<html>`, nil, true},
	}
	for _, c := range cases {
		got, err := parseWorkers([]byte(c.in))
		if (err != nil) != c.bad || !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: got %v, %v; want %v (error %v)", c.name, got, err, c.want, c.bad)
		}
	}
}

func TestParseEndpoints(t *testing.T) {
	got, err := parseEndpoints(" http://a:1/, b:2 ,grpc://c:3,", "", RoleDecode)
	want := []discovered{{RoleDecode, "", "http://a:1", "", ""}, {RoleDecode, "", "http://b:2", "", ""}, {RoleDecode, "c:3", "", "", ""}}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, %v; want %v", got, err, want)
	}
	if _, err := parseEndpoints("ftp://x:1", "", RolePrefill); err == nil || !strings.Contains(err.Error(), "--prefill") {
		t.Errorf("ftp scheme: %v, want an error naming --prefill", err)
	}
	got, err = parseEndpoints("http://a:1,grpc://c:3", "a:9, http://c:9/", RolePrefill)
	want = []discovered{{RolePrefill, "", "http://a:1", "", "http://a:9"}, {RolePrefill, "c:3", "", "", "http://c:9"}}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("with admins: got %v, %v; want %v", got, err, want)
	}
	if _, err := parseEndpoints("a:1", "a:9,b:9", RolePrefill); err == nil || !strings.Contains(err.Error(), "--prefill-admin") {
		t.Errorf("2 admins for 1 worker: %v, want an error naming --prefill-admin", err)
	}
}
