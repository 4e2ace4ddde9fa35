package model

import (
	"fmt"
	"strings"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/engine/gguf"
)

// Inspect reads the hyper-parameters and fingerprint of the model in f
// without binding its weights: what a router needs to validate requests and
// to check that workers serve the same model. contextLength > 0 overrides
// the context window, as Options.ContextLength does for Load.
func Inspect(f *gguf.File, contextLength int) (Config, string, error) {
	arch, ok := f.String("general.architecture")
	if !ok {
		return Config{}, "", fmt.Errorf("model: no general.architecture in the file: %w", engine.ErrInvalidInput)
	}
	if _, ok := architectures()[arch]; !ok {
		return Config{}, "", fmt.Errorf("model: architecture %q is not supported (supported: %s): %w",
			arch, strings.Join(Architectures(), ", "), engine.ErrUnsupported)
	}
	cfg, err := readConfig(f, arch)
	if err != nil {
		return Config{}, "", err
	}
	if contextLength > 0 {
		cfg.ContextLength = contextLength
	}
	return cfg, Fingerprint(f, cfg), nil
}
