package openai

// GET /v1/models and GET /v1/models/{model}: the one served model, as
// OpenAI's model object with Baton's additions.

import (
	"fmt"
	"net/http"
)

// modelObject is an OpenAI model object with Baton's additions.
type modelObject struct {
	ID            string `json:"id"`
	Object        string `json:"object"`
	Created       int64  `json:"created"`
	OwnedBy       string `json:"owned_by"`
	Fingerprint   string `json:"fingerprint,omitempty"`
	Architecture  string `json:"architecture,omitempty"`
	ContextLength int    `json:"context_length"`
	VocabSize     int    `json:"vocab_size"`
}

func (h *Handler) modelObject() modelObject {
	owner := h.model.OwnedBy
	if owner == "" {
		owner = "baton"
	}
	return modelObject{ID: h.model.ID, Object: "model", Created: h.model.Created, OwnedBy: owner,
		Fingerprint: h.model.Fingerprint, Architecture: h.model.Architecture,
		ContextLength: h.model.ContextLength, VocabSize: h.model.Tokenizer.VocabSize()}
}

func (h *Handler) listModels(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, struct {
		Object string        `json:"object"`
		Data   []modelObject `json:"data"`
	}{"list", []modelObject{h.modelObject()}})
}

func (h *Handler) getModel(w http.ResponseWriter, r *http.Request) {
	if id := r.PathValue("model"); id != h.model.ID {
		h.unknownModel(id).write(w, r)
		return
	}
	writeJSON(w, http.StatusOK, h.modelObject())
}

func (h *Handler) unknownModel(id string) *httpError {
	return &httpError{status: http.StatusNotFound, typ: typeInvalidRequest, param: "model", code: "model_not_found",
		message: fmt.Sprintf("model %q does not exist here; this server serves %q", id, h.model.ID)}
}
