package svckit

import (
	"path/filepath"
	"strings"
	"time"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
)

// ModelID is the name a model file is served under: its file name without
// the .gguf extension.
func ModelID(path string) string {
	return strings.TrimSuffix(filepath.Base(path), ".gguf")
}

// BasicModelInfo describes a model by its file alone, for services that have
// not loaded it.
func BasicModelInfo(path string, loaded time.Time) *batonv1.ModelInfo {
	return &batonv1.ModelInfo{Id: ModelID(path), Object: "model", Created: loaded.Unix(), OwnedBy: "baton"}
}
