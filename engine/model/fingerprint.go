package model

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash"

	"github.com/baton-serving/baton/engine/gguf"
)

// fingerprintEdge is how many bytes from each end of every tensor's data the
// fingerprint covers.
const fingerprintEdge = 64

// Fingerprint identifies a model for the prefill/decode handoff: two services
// must agree on it before one computes KV cache that the other continues. It
// is "sha256:" followed by the hex SHA-256 of, in order:
//
//   - a version tag ("baton-model-fingerprint/v1");
//   - cfg (architecture, every hyper-parameter, tied output), with the
//     context window as the file declares it;
//   - for a file with longrope factors (phi3 128k), which set the context
//     window in use picks (Config.LongRope);
//   - the tokenizer: tokenizer.ggml.model and every token string, since a
//     different vocabulary changes what the ids mean;
//   - for each tensor in file order: name, type, dims, byte size, and the
//     first and last 64 bytes of its data.
//
// It costs a few kilobytes of hashing per tensor whatever the file's size,
// so it is computed at every load. It does not hash every weight: two files
// that differ only in the middle of a tensor get the same fingerprint. That
// is accepted — it guards against deploying different models or
// quantizations on the two sides, not against tampering.
func Fingerprint(f *gguf.File, cfg Config) string {
	h := sha256.New()
	str := func(s string) {
		writeUint(h, uint64(len(s)))
		h.Write([]byte(s))
	}
	str("baton-model-fingerprint/v1")
	// The context window may be overridden per process; it does not change
	// what the weights compute, so the file's value is hashed.
	long := cfg.LongRope()
	cfg.ContextLength = cfg.TrainContextLength
	str(fmt.Sprintf("%+v", cfg))
	// Except where it picks phi3's longrope factors (Config.LongRope):
	// then the two sides must pick the same ones.
	if _, ok := f.Tensor("rope_factors_long.weight"); ok {
		str(fmt.Sprint("longrope ", long))
	}
	tm, _ := f.String("tokenizer.ggml.model")
	str(tm)
	toks, _ := f.Strings("tokenizer.ggml.tokens")
	writeUint(h, uint64(len(toks)))
	for _, t := range toks {
		str(t)
	}
	writeUint(h, uint64(len(f.Tensors)))
	for i := range f.Tensors {
		t := &f.Tensors[i]
		str(t.Name)
		writeUint(h, uint64(t.Type))
		writeUint(h, uint64(len(t.Dims)))
		for _, d := range t.Dims {
			writeUint(h, d)
		}
		writeUint(h, t.Size)
		data := f.TensorData(t)
		if len(data) <= 2*fingerprintEdge {
			h.Write(data)
		} else {
			h.Write(data[:fingerprintEdge])
			h.Write(data[len(data)-fingerprintEdge:])
		}
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

func writeUint(h hash.Hash, v uint64) {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], v)
	h.Write(b[:])
}
