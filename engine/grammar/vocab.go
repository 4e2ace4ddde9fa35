package grammar

import (
	"bytes"
	"slices"
)

// Vocab is a model's tokens as the bytes each appends to the output text,
// with a token trie; built once per model and shared (safe for concurrent use).
// pieces[i] == nil: token i can never be produced under a grammar (control
// tokens), except the end-of-generation ids eog, allowed exactly where a
// sentence of the grammar is complete.
type Vocab struct {
	pieces [][]byte // views into one buffer
	eog    []uint64 // bitset of the end-of-generation ids

	// The trie, nodes numbered breadth first from the root 0: node i's
	// edges are label/child[first[i]:first[i+1]] (sorted by byte), and the
	// tokens whose piece ends at node i are toks[tokFirst[i]:tokFirst[i+1]].
	// Tokens with nil or empty pieces and end-of-generation ids are not in
	// the trie.
	first    []int32
	label    []byte
	child    []int32
	tokFirst []int32
	toks     []int32
}

// NewVocab builds the vocabulary and its trie. It copies pieces. Ids in
// eog outside [0, len(pieces)) are ignored.
func NewVocab(pieces [][]byte, eog []int32) *Vocab {
	v := &Vocab{pieces: make([][]byte, len(pieces)), eog: make([]uint64, (len(pieces)+63)/64)}
	total := 0
	for _, p := range pieces {
		total += len(p)
	}
	buf := make([]byte, 0, total)
	for i, p := range pieces {
		if p != nil {
			start := len(buf)
			buf = append(buf, p...)
			v.pieces[i] = buf[start:len(buf):len(buf)]
		}
	}
	for _, id := range eog {
		if id >= 0 && int(id) < len(pieces) {
			v.eog[id>>6] |= 1 << (id & 63)
		}
	}
	var ids []int32
	for i, p := range v.pieces {
		if len(p) > 0 && !v.isEOG(int32(i)) {
			ids = append(ids, int32(i))
		}
	}
	slices.SortStableFunc(ids, func(a, b int32) int { return bytes.Compare(v.pieces[a], v.pieces[b]) })

	// Breadth first: each queued node is a run of sorted ids sharing a
	// prefix of length depth.
	type span struct{ lo, hi, depth int }
	queue := []span{{0, len(ids), 0}}
	for qi := 0; qi < len(queue); qi++ {
		s := queue[qi]
		v.first = append(v.first, int32(len(v.label)))
		v.tokFirst = append(v.tokFirst, int32(len(v.toks)))
		i := s.lo
		for i < s.hi && len(v.pieces[ids[i]]) == s.depth {
			if s.depth > 0 {
				v.toks = append(v.toks, ids[i])
			}
			i++
		}
		for i < s.hi {
			b := v.pieces[ids[i]][s.depth]
			j := i + 1
			for j < s.hi && v.pieces[ids[j]][s.depth] == b {
				j++
			}
			v.label = append(v.label, b)
			v.child = append(v.child, int32(len(queue)))
			queue = append(queue, span{i, j, s.depth + 1})
			i = j
		}
	}
	v.first = append(v.first, int32(len(v.label)))
	v.tokFirst = append(v.tokFirst, int32(len(v.toks)))
	return v
}

// Size is the number of token ids.
func (v *Vocab) Size() int { return len(v.pieces) }

// Nodes is the number of trie nodes (for benchmarks and sizing).
func (v *Vocab) Nodes() int { return len(v.first) - 1 }

func (v *Vocab) isEOG(id int32) bool {
	return id >= 0 && int(id) < len(v.pieces) && v.eog[id>>6]>>(id&63)&1 != 0
}
