package svckit

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/baton-serving/baton/engine/modelfile"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
)

// ModelFlag is the --model flag every service takes.
type ModelFlag struct {
	Ref  string // as given: a path or hf://OWNER/REPO/FILE.gguf
	Path string // resolved local file, set by Resolve
}

// AddFlags registers --model.
func (m *ModelFlag) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&m.Ref, "model", "",
		"GGUF model: a local path or hf://OWNER/REPO/FILE.gguf (default: "+modelfile.DefaultHelp+", when it exists)")
}

// Resolve finds the model file: the flag (or $BATON_MODEL), else the default
// model; downloads hf:// references into the cache. The error says what is
// missing.
func (m *ModelFlag) Resolve(ctx context.Context) error {
	ref := modelfile.FromEnv(m.Ref)
	if ref == "" {
		return errors.New("--model: no model given and the default ../shared/models/stories260K.gguf was not found beside the working directory or the binary; pass --model PATH (or hf://OWNER/REPO/FILE.gguf) or set BATON_MODEL")
	}
	p, err := modelfile.Resolve(ctx, ref, modelfile.Options{})
	if err != nil {
		return fmt.Errorf("--model: %w", err)
	}
	m.Path = p
	return nil
}

// ModelBase is the part of a Service that every Baton service shares: the
// --model flag, resolved in Open. Services embed it and add their own flags,
// Register and, where they hold more, Validate and Close.
type ModelBase struct {
	Model ModelFlag
	// Opened is when the model was resolved; reported as the model's "created".
	Opened time.Time
}

// AddFlags registers --model.
func (b *ModelBase) AddFlags(fs *flag.FlagSet) { b.Model.AddFlags(fs) }

// Validate accepts any --model value; Open checks it.
func (b *ModelBase) Validate() error { return nil }

// Open resolves the model file.
func (b *ModelBase) Open(ctx context.Context, d *Deps) error {
	if err := b.Model.Resolve(ctx); err != nil {
		return err
	}
	b.Opened = time.Now()
	d.Logger.Info("model", "path", b.Model.Path)
	return nil
}

// Close releases nothing.
func (b *ModelBase) Close() error { return nil }

// ModelInfo describes the model by its file.
func (b *ModelBase) ModelInfo() *batonv1.ModelInfo { return BasicModelInfo(b.Model.Path, b.Opened) }
