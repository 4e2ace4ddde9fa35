package model

import "github.com/baton-serving/baton/engine/model/arch"

// Config holds a model's hyper-parameters as read from the GGUF metadata,
// with llama.cpp's defaults filled in; package arch defines it, beside the
// architectures' tensor tables whose shapes are functions of it.
type Config = arch.Config

// maxDim bounds every size read from metadata, so that products of two of
// them (rows·cols, positions·width) cannot overflow an int.
const maxDim = arch.MaxDim
