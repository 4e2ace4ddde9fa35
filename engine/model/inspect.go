package model

import (
	"github.com/baton-serving/baton/engine/gguf"
	"github.com/baton-serving/baton/engine/model/arch"
)

// Inspect reads the hyper-parameters and fingerprint of the model in f
// without binding its weights: what a router needs to validate requests and
// to check that workers serve the same model. contextLength > 0 overrides
// the context window, as Options.ContextLength does for Load.
func Inspect(f *gguf.File, contextLength int) (Config, string, error) {
	a, err := lookupArch(f)
	if err != nil {
		return Config{}, "", err
	}
	cfg, err := arch.ReadConfig(f, a)
	if err != nil {
		return Config{}, "", err
	}
	if contextLength > 0 {
		cfg.ContextLength = contextLength
	}
	return cfg, Fingerprint(f, cfg), nil
}
