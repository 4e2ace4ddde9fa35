package svckit

import (
	"context"
	"errors"
	"flag"
	"fmt"

	"github.com/baton-serving/baton/engine/modelfile"
)

// ModelFlag is the --model flag every service takes.
type ModelFlag struct {
	Ref  string // as given: a path or hf://OWNER/REPO/FILE.gguf
	Path string // resolved local file, set by Resolve
}

// AddFlags registers --model.
func (m *ModelFlag) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&m.Ref, "model", "",
		"GGUF model: a local path or hf://OWNER/REPO/FILE.gguf (default: ../shared/models/stories260K.gguf when it exists)")
}

// Resolve finds the model file: the flag (or $BATON_MODEL), else the default
// model; downloads hf:// references into the cache. The error says what is
// missing.
func (m *ModelFlag) Resolve(ctx context.Context) error {
	ref := modelfile.FromEnv(m.Ref)
	if ref == "" {
		return errors.New("--model: no model given and the default ../shared/models/stories260K.gguf was not found; pass --model PATH or set BATON_MODEL")
	}
	p, err := modelfile.Resolve(ctx, ref, modelfile.Options{})
	if err != nil {
		return fmt.Errorf("--model: %w", err)
	}
	m.Path = p
	return nil
}
