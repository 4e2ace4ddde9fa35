package arch

import (
	"strings"
	"testing"
)

// TestTables checks every registered table for what the binder and the
// decoder rely on: each role filled by one tensor at most, global roles in
// global tensors and layer roles in per-layer ones, vectors of one part,
// matrices with row counts, no duplicate names, the roles the decoder
// always uses present and required, and the name a file declares matching
// the registry's key.
func TestTables(t *testing.T) {
	required := []Role{TokEmbd, OutputNorm, AttnNorm, Wq, Wk, Wv, Wo, FFNNorm, Gate, Up, Down}
	c := Config{Dim: 64, Hidden: 96, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 16, Vocab: 300, RopeDim: 16}
	for _, name := range Names() {
		a, ok := Lookup(name)
		if !ok || a.Name != name {
			t.Fatalf("Lookup(%q) = %v, %v", name, a, ok)
		}
		seen := map[Role]string{}
		names := map[string]bool{}
		for _, tn := range a.Tensors {
			if names[tn.Name] {
				t.Errorf("%s: tensor %s declared twice", name, tn.Name)
			}
			names[tn.Name] = true
			if len(tn.Parts) == 0 || tn.Cols == nil {
				t.Errorf("%s: tensor %s has no parts or no columns", name, tn.Name)
				continue
			}
			if tn.Vector && (len(tn.Parts) != 1 || tn.Parts[0].Rows != nil) {
				t.Errorf("%s: vector %s must have one part without rows", name, tn.Name)
			}
			if strings.Count(tn.Name, "%") > 1 || tn.PerLayer() && !strings.HasPrefix(tn.Name, "blk.%d.") {
				t.Errorf("%s: per-layer tensor %s must be named blk.%%d.…", name, tn.Name)
			}
			for _, p := range tn.Parts {
				if !tn.Vector && p.Rows == nil {
					t.Errorf("%s: matrix %s part %s has no rows", name, tn.Name, p.Role)
				}
				if p.Role.Layer() != tn.PerLayer() {
					t.Errorf("%s: role %s (layer %v) in tensor %s", name, p.Role, p.Role.Layer(), tn.Name)
				}
				if prev, dup := seen[p.Role]; dup {
					t.Errorf("%s: role %s filled by %s and %s", name, p.Role, prev, tn.Name)
				}
				seen[p.Role] = tn.Name
				if p.Role == Output && !tn.Optional {
					t.Errorf("%s: output.weight must be optional (tied files lack it)", name)
				}
			}
			if tn.Rows(c) <= 0 || tn.Cols(c) <= 0 {
				t.Errorf("%s: tensor %s sized %d×%d", name, tn.Name, tn.Rows(c), tn.Cols(c))
			}
		}
		for _, r := range required {
			tn, ok := seen[r]
			if !ok {
				t.Errorf("%s: no tensor for role %s, which the decoder always uses", name, r)
				continue
			}
			for _, d := range a.Tensors {
				if d.Name == tn && d.Optional {
					t.Errorf("%s: role %s is optional in %s; the decoder needs it", name, r, tn)
				}
			}
		}
	}
	if _, ok := Lookup("gptj"); ok {
		t.Error("Lookup found an unregistered architecture")
	}
	for r := Role(0); r < NumRoles; r++ {
		if strings.HasPrefix(r.String(), "Role(") || r.String() == "" {
			t.Errorf("role %d has no name", r)
		}
	}
}
