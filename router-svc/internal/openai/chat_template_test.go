package openai

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
)

// The chat-template conformance tests: the router renders each model
// family's template as Hugging Face's apply_chat_template renders it with
// Python's jinja2 (the oracle, testdata/templates/render.py), on the
// conversation corpus testdata/templates/corpus.json.
//
//   - TestChatTemplateGolden (CI): Baton's own template of each family
//     (testdata/templates/<family>.jinja) renders every corpus case exactly
//     as jinja2 rendered the family's real template (the golden files
//     testdata/templates/golden/<family>.json, recorded with render.py; see
//     the README there).
//   - TestRealChatTemplates (BATON_CHAT_TEMPLATES_DIR set): every real
//     template in that directory renders through the router's code exactly
//     as jinja2 renders it, run now.

// templateFamily ties a family's Baton template to the real template its
// golden file was recorded from, with the texts of the model's BOS and EOS
// tokens as its GGUF files give them.
type templateFamily struct {
	baton    string   // testdata/templates/<baton>, golden/<golden>.json
	real     []string // the real templates' file names (ik_llama.cpp's models/templates, or where named)
	bos, eos string
	family   toolFamily
	tools    bool // the template renders a tools list itself
}

var templateFamilies = []templateFamily{
	{"qwen25.jinja", []string{"Qwen-Qwen2.5-7B-Instruct.jinja"}, "<|endoftext|>", "<|im_end|>", familyHermes, true},
	{"qwen3.jinja", []string{"Qwen-Qwen3-0.6B.jinja"}, "<|endoftext|>", "<|im_end|>", familyHermes, true},
	// Llama 3.1 and 3.3 Instruct ship the same template.
	{"llama3.jinja", []string{"meta-llama-Llama-3.1-8B-Instruct.jinja", "meta-llama-Llama-3.3-70B-Instruct.jinja"}, "<|begin_of_text|>", "<|eot_id|>", familyLlama3, true},
	{"llama32.jinja", []string{"meta-llama-Llama-3.2-3B-Instruct.jinja"}, "<|begin_of_text|>", "<|eot_id|>", familyLlama3, true},
	{"phi3.jinja", []string{"microsoft-Phi-3.5-mini-instruct.jinja"}, "<s>", "<|endoftext|>", familyGeneric, false},
	{"gemma2.jinja", []string{"google-gemma-2-2b-it.jinja"}, "<bos>", "<eos>", familyGeneric, false},
	// Gemma 3's template is google/gemma-3-*-it's tokenizer_config.json chat_template (not in ik_llama.cpp).
	{"gemma3.jinja", []string{"google-gemma-3-1b-it.jinja"}, "<bos>", "<eos>", familyGeneric, false},
	{"mistral.jinja", []string{"mistralai-Mistral-Nemo-Instruct-2407.jinja"}, "<s>", "</s>", familyMistral, true},
}

func (f templateFamily) golden() string {
	return filepath.Join("testdata", "templates", "golden", strings.TrimSuffix(f.baton, ".jinja")+".json")
}

// corpus is testdata/templates/corpus.json.
type corpus struct {
	Now           string `json:"now"`
	Conversations []struct {
		Name  string `json:"name"`
		Tools []struct {
			Name        string          `json:"name"`
			Description *string         `json:"description"`
			Parameters  json.RawMessage `json:"parameters"`
		} `json:"tools"`
		Messages []struct {
			Role       string `json:"role"`
			Content    string `json:"content"`
			Name       string `json:"name"`
			ToolCallID string `json:"tool_call_id"`
			ToolCalls  []struct {
				ID        string `json:"id"`
				Name      string `json:"name"`
				Arguments string `json:"arguments"`
			} `json:"tool_calls"`
		} `json:"messages"`
	} `json:"conversations"`
}

// rendering is one case's result: the prompt, or the template's error.
type rendering struct {
	Text  *string `json:"text,omitempty"`
	Error string  `json:"error,omitempty"`
}

const corpusPath = "testdata/templates/corpus.json"

func loadCorpus(t testing.TB) *corpus {
	t.Helper()
	b, err := os.ReadFile(corpusPath)
	if err != nil {
		t.Fatal(err)
	}
	var c corpus
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatalf("%s: %v", corpusPath, err)
	}
	return &c
}

// renderCorpus renders every case of c with tmpl through RenderVars, the
// router's code path, with the variants render.py renders.
func renderCorpus(t testing.TB, c *corpus, tmpl *ChatTemplate) map[string]rendering {
	t.Helper()
	now, err := time.ParseInLocation("2006-01-02T15:04:05", c.Now, time.Local)
	if err != nil {
		t.Fatalf("corpus now: %v", err)
	}
	tmpl.now = func() time.Time { return now }
	out := map[string]rendering{}
	for _, conv := range c.Conversations {
		msgs := make([]Message, len(conv.Messages))
		for i, m := range conv.Messages {
			msgs[i] = Message{Role: m.Role, Content: m.Content, Name: m.Name, ToolCallID: m.ToolCallID}
			for _, tc := range m.ToolCalls {
				msgs[i].ToolCalls = append(msgs[i].ToolCalls, ToolCall{ID: tc.ID, Name: tc.Name, Arguments: tc.Arguments})
			}
		}
		var tools []ToolDef
		for _, td := range conv.Tools {
			tools = append(tools, ToolDef{Name: td.Name, Description: td.Description, Parameters: td.Parameters})
		}
		// A template that does not show tools gets Baton's generic
		// preamble instead (TestGenericToolsPreamble); the template itself
		// sees no tools, as jinja2's rendering of it shows none.
		if !tmpl.RendersTools() {
			tools = nil
		}
		for _, agp := range []bool{true, false} {
			for _, think := range []*bool{nil, ptr(true), ptr(false)} {
				name := conv.Name + "/" + map[bool]string{true: "gen", false: "nogen"}[agp]
				var vars map[string]any
				if think != nil {
					vars = map[string]any{"enable_thinking": *think}
					name += map[bool]string{true: "+think", false: "+nothink"}[*think]
				}
				text, err := tmpl.RenderVars(msgs, tools, agp, vars)
				if err != nil {
					out[name] = rendering{Error: err.Error()}
				} else {
					out[name] = rendering{Text: &text}
				}
			}
		}
	}
	return out
}

// compareRenderings lists the cases where got differs from want (the
// oracle's): a different prompt, or an error on one side only. The
// message a template raises itself must reach the router's error.
func compareRenderings(want, got map[string]rendering) []string {
	var diffs []string
	names := make([]string, 0, len(want))
	for n := range want {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		w, g := want[n], got[n]
		switch {
		case g.Text == nil && g.Error == "":
			diffs = append(diffs, fmt.Sprintf("%s: not rendered", n))
		case w.Error != "" && g.Error == "":
			diffs = append(diffs, fmt.Sprintf("%s: jinja2 fails (%s), the router renders\n%q", n, w.Error, *g.Text))
		case w.Error == "" && g.Error != "":
			diffs = append(diffs, fmt.Sprintf("%s: jinja2 renders\n%q\nthe router fails: %s", n, *w.Text, g.Error))
		case w.Error != "":
			if msg, ok := strings.CutPrefix(w.Error, "TemplateError: "); ok && !strings.Contains(g.Error, msg) {
				diffs = append(diffs, fmt.Sprintf("%s: the template raises %q, the router says %q", n, msg, g.Error))
			}
		case *w.Text != *g.Text:
			diffs = append(diffs, fmt.Sprintf("%s:\njinja2 %q\nrouter %q\n(first difference at byte %d)", n, *w.Text, *g.Text, firstDiff(*w.Text, *g.Text)))
		}
	}
	for n := range got {
		if _, ok := want[n]; !ok {
			diffs = append(diffs, fmt.Sprintf("%s: no such case in the oracle's renderings", n))
		}
	}
	return diffs
}

func firstDiff(a, b string) int {
	for i := 0; i < min(len(a), len(b)); i++ {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

func readRenderings(t testing.TB, path string) map[string]rendering {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]rendering
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return m
}

// TestChatTemplateGolden: each family's Baton template, rendered by the
// router, gives exactly the prompt jinja2 gave for the family's real
// template on every corpus case (errors where it raised one), and is
// recognised as the family it is.
func TestChatTemplateGolden(t *testing.T) {
	c := loadCorpus(t)
	total := 0
	for _, f := range templateFamilies {
		t.Run(f.baton, func(t *testing.T) {
			tmpl, err := NewChatTemplate(readTemplate(t, f.baton), f.bos, f.eos)
			if err != nil {
				t.Fatal(err)
			}
			if tmpl.family != f.family || tmpl.RendersTools() != f.tools {
				t.Errorf("tool family %v, renders tools %v; want %v, %v", tmpl.family, tmpl.RendersTools(), f.family, f.tools)
			}
			want := readRenderings(t, f.golden())
			got := renderCorpus(t, c, tmpl)
			for _, d := range compareRenderings(want, got) {
				t.Error(d)
			}
			total += len(want)
		})
	}
	t.Logf("%d templates x %d cases", len(templateFamilies), total/len(templateFamilies))
}

// TestRealChatTemplates renders every *.jinja file in
// $BATON_CHAT_TEMPLATES_DIR (the models' own templates, which Baton does
// not ship: e.g. ik_llama.cpp's models/templates) with the router and with
// jinja2 (python3 with jinja2 installed), and wants them equal; the
// families' files must also still give their golden renderings.
func TestRealChatTemplates(t *testing.T) {
	dir := os.Getenv("BATON_CHAT_TEMPLATES_DIR")
	if dir == "" {
		t.Skip("BATON_CHAT_TEMPLATES_DIR is not set")
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.jinja"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no *.jinja in %s (%v)", dir, err)
	}
	c := loadCorpus(t)
	var equal, cases, templates int
	for _, path := range files {
		name := filepath.Base(path)
		fam, known := familyOfReal(name)
		bos, eos := "<s>", "</s>"
		if known {
			bos, eos = fam.bos, fam.eos
		}
		t.Run(name, func(t *testing.T) {
			want := oracle(t, path, bos, eos)
			src, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			tmpl, err := NewChatTemplate(string(src), bos, eos)
			if err != nil {
				t.Fatal(err)
			}
			if known && (tmpl.family != fam.family || tmpl.RendersTools() != fam.tools) {
				t.Errorf("tool family %v, renders tools %v; want %v, %v", tmpl.family, tmpl.RendersTools(), fam.family, fam.tools)
			}
			diffs := compareRenderings(want, renderCorpus(t, c, tmpl))
			for _, d := range diffs {
				t.Error(d)
			}
			templates++
			cases += len(want)
			equal += len(want) - len(diffs)
			if known {
				for _, d := range compareRenderings(readRenderings(t, fam.golden()), want) {
					t.Errorf("golden %s is stale: %s", fam.golden(), d)
				}
			}
		})
	}
	t.Logf("%d templates, %d cases: %d equal", templates, cases, equal)
}

func familyOfReal(name string) (templateFamily, bool) {
	for _, f := range templateFamilies {
		for _, r := range f.real {
			if r == name {
				return f, true
			}
		}
	}
	return templateFamily{}, false
}

// oracle runs render.py on one template.
func oracle(t testing.TB, path, bos, eos string) map[string]rendering {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command("python3", filepath.Join("testdata", "templates", "render.py"), corpusPath, path, bos, eos)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("render.py (needs python3 with jinja2): %v\n%s", err, stderr.String())
	}
	var m map[string]rendering
	if err := json.Unmarshal(stdout.Bytes(), &m); err != nil {
		t.Fatal(err)
	}
	return m
}
