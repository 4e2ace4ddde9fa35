package openai

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// tojsonSource is a JSON object with what Python's json.dumps writes its own
// way: floats (1e+16, 1e-05, 2.5, -0.0), a big int, HTML characters,
// non-ASCII, U+2028, DEL and control characters, empty containers, and
// keys out of order.
const tojsonSource = `"{\"z\": 1, \"a\": [1.0, 2.5, 1e16, 1e-05, 0.0001, 123456789012345678, -0.0, 1e300, 3.14159], \"m\": {\"html\": \"<b>&amp;</b>\", \"u\": \"Z\u00fcrich \u65e5\u672c \ud83d\ude42\\u2028\\u007f\", \"ctl\": \"\\n\\t\\u0001\\\"\\\\\"}, \"e\": {}, \"l\": [], \"n\": null, \"t\": true}"`

// TestTemplateTojson: a template's tojson filter writes what Hugging Face's
// (Python's json.dumps with ensure_ascii=False) writes, indented or not —
// key order kept, <, > and & as they are, floats as Python prints them.
// Each want is Python 3's output (a JSON string, decoded here).
func TestTemplateTojson(t *testing.T) {
	var src string
	if err := json.Unmarshal([]byte(tojsonSource), &src); err != nil {
		t.Fatal(err)
	}
	cases := []struct{ filter, want string }{
		{"tojson", `"{\"z\": 1, \"a\": [1.0, 2.5, 1e+16, 1e-05, 0.0001, 123456789012345678, -0.0, 1e+300, 3.14159], \"m\": {\"html\": \"<b>&amp;</b>\", \"u\": \"Z\u00fcrich \u65e5\u672c \ud83d\ude42\u2028\u007f\", \"ctl\": \"\\n\\t\\u0001\\\"\\\\\"}, \"e\": {}, \"l\": [], \"n\": null, \"t\": true}"`},
		{"tojson(indent=4)", `"{\n    \"z\": 1,\n    \"a\": [\n        1.0,\n        2.5,\n        1e+16,\n        1e-05,\n        0.0001,\n        123456789012345678,\n        -0.0,\n        1e+300,\n        3.14159\n    ],\n    \"m\": {\n        \"html\": \"<b>&amp;</b>\",\n        \"u\": \"Z\u00fcrich \u65e5\u672c \ud83d\ude42\u2028\u007f\",\n        \"ctl\": \"\\n\\t\\u0001\\\"\\\\\"\n    },\n    \"e\": {},\n    \"l\": [],\n    \"n\": null,\n    \"t\": true\n}"`},
		{"tojson(indent=2, sort_keys=true)", `"{\n  \"a\": [\n    1.0,\n    2.5,\n    1e+16,\n    1e-05,\n    0.0001,\n    123456789012345678,\n    -0.0,\n    1e+300,\n    3.14159\n  ],\n  \"e\": {},\n  \"l\": [],\n  \"m\": {\n    \"ctl\": \"\\n\\t\\u0001\\\"\\\\\",\n    \"html\": \"<b>&amp;</b>\",\n    \"u\": \"Z\u00fcrich \u65e5\u672c \ud83d\ude42\u2028\u007f\"\n  },\n  \"n\": null,\n  \"t\": true,\n  \"z\": 1\n}"`},
		{"tojson(separators=[',', ':'])", `"{\"z\":1,\"a\":[1.0,2.5,1e+16,1e-05,0.0001,123456789012345678,-0.0,1e+300,3.14159],\"m\":{\"html\":\"<b>&amp;</b>\",\"u\":\"Z\u00fcrich \u65e5\u672c \ud83d\ude42\u2028\u007f\",\"ctl\":\"\\n\\t\\u0001\\\"\\\\\"},\"e\":{},\"l\":[],\"n\":null,\"t\":true}"`},
		{"tojson(ensure_ascii=true)", `"{\"z\": 1, \"a\": [1.0, 2.5, 1e+16, 1e-05, 0.0001, 123456789012345678, -0.0, 1e+300, 3.14159], \"m\": {\"html\": \"<b>&amp;</b>\", \"u\": \"Z\\u00fcrich \\u65e5\\u672c \\ud83d\\ude42\\u2028\\u007f\", \"ctl\": \"\\n\\t\\u0001\\\"\\\\\"}, \"e\": {}, \"l\": [], \"n\": null, \"t\": true}"`},
	}
	for _, c := range cases {
		tmpl, err := NewChatTemplate("{% if tools %}{{ tools[0].function.parameters | "+c.filter+" }}{% endif %}", "", "")
		if err != nil {
			t.Fatal(err)
		}
		var want string
		if err := json.Unmarshal([]byte(c.want), &want); err != nil {
			t.Fatal(err)
		}
		got, err := tmpl.RenderTools([]Message{{Role: "user", Content: "x"}}, []ToolDef{{Name: "f", Parameters: json.RawMessage(src)}}, false)
		if err != nil {
			t.Errorf("%s: %v", c.filter, err)
			continue
		}
		if got != want {
			t.Errorf("%s:\ngot  %q\nwant %q", c.filter, got, want)
		}
	}
	// What json.dumps cannot encode is an error, not "" (here when the
	// template is loaded: its self-check renders it).
	if _, err := NewChatTemplate("{{ nothing | tojson }}", "", ""); err == nil || !strings.Contains(err.Error(), "not JSON serializable") {
		t.Errorf("tojson of an undefined value: %v, want an error", err)
	}
}

// TestTemplateStrftimeNow: strftime_now formats the router's clock as
// Python's strftime does (Llama 3.2's "Today Date: 07 Mar 2026").
func TestTemplateStrftimeNow(t *testing.T) {
	tmpl, err := NewChatTemplate(`{{ strftime_now("%d %b %Y") }}|{{ strftime_now("%A %B %e %H:%M:%S %p %j %y %% %Q") }}`, "", "")
	if err != nil {
		t.Fatal(err)
	}
	tmpl.now = func() time.Time { return time.Date(2026, 3, 7, 9, 5, 2, 0, time.UTC) }
	got, err := tmpl.Render([]Message{{Role: "user", Content: "x"}}, false)
	if err != nil {
		t.Fatal(err)
	}
	if want := "07 Mar 2026|Saturday March  7 09:05:02 AM 066 26 % %Q"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}
