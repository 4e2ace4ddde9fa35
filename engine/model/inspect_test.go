package model

import (
	"path/filepath"
	"testing"

	"github.com/baton-serving/baton/engine/gguf"
)

func TestInspectMatchesLoad(t *testing.T) {
	path := filepath.Join(sharedDir(t), "models", "stories260K.gguf")
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
