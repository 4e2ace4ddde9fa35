package model

import (
	"path/filepath"
	"testing"

	"github.com/baton-serving/baton/engine/gguf"
	"github.com/baton-serving/baton/engine/refdata"
	"github.com/baton-serving/baton/engine/testmodel"
)

func TestInspectMatchesLoad(t *testing.T) {
	path := refdata.Model(t)
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cfg, fp, err := Inspect(f, 512)
	if err != nil {
		t.Fatal(err)
	}
	m, err := Load(f, Options{ContextLength: 512})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if cfg != m.Config() || fp != m.Fingerprint() {
		t.Errorf("Inspect = %+v %s, Load = %+v %s", cfg, fp, m.Config(), m.Fingerprint())
	}
	if cfg.ContextLength != 512 || cfg.TrainContextLength != 128 {
		t.Errorf("context %d / train %d", cfg.ContextLength, cfg.TrainContextLength)
	}
}

// TestInspectMatchesLoadTied: a router (Inspect) and a worker (Load) must
// compute the same fingerprint for a model whose output head is tied to the
// token embedding, or the router refuses the worker.
func TestInspectMatchesLoadTied(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tied.gguf")
	spec, ok := testmodel.Preset("tiny")
	if !ok {
		t.Fatal("no tiny preset")
	}
	spec.Tied = true
	if err := testmodel.Write(path, spec); err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cfg, fp, err := Inspect(f, 0)
	if err != nil {
		t.Fatal(err)
	}
	m, err := Load(f, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if !cfg.TiedOutput || cfg != m.Config() || fp != m.Fingerprint() {
		t.Errorf("Inspect = %+v %s\nLoad    = %+v %s", cfg, fp, m.Config(), m.Fingerprint())
	}
}
