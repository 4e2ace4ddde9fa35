package tokenizer

// bigram is a candidate merge of two adjacent symbols. For the SentencePiece
// model the best bigram has the highest score; for byte-level BPE the lowest
// rank, which mergeSession.bpe stores as a negated score so one ordering serves
// both. Ties go to the leftmost pair, as in llama.cpp.
type bigram struct {
	left, right int
	score       float64
	size        int // bytes of the merged text; a mismatch means stale
}

func (a bigram) before(b bigram) bool {
	return a.score > b.score || (a.score == b.score && a.left < b.left)
}

// bigramQueue is a binary max-heap of bigrams ordered by before.
type bigramQueue []bigram

func (q *bigramQueue) push(b bigram) {
	h := append(*q, b)
	i := len(h) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !h[i].before(h[p]) {
			break
		}
		h[i], h[p] = h[p], h[i]
		i = p
	}
	*q = h
}

func (q *bigramQueue) pop() bigram {
	h := *q
	top := h[0]
	last := len(h) - 1
	h[0] = h[last]
	h = h[:last]
	for i := 0; ; {
		l, best := 2*i+1, i
		if l < len(h) && h[l].before(h[best]) {
			best = l
		}
		if r := l + 1; r < len(h) && h[r].before(h[best]) {
			best = r
		}
		if best == i {
			break
		}
		h[i], h[best] = h[best], h[i]
		i = best
	}
	*q = h
	return top
}

// symbol is a run of bytes text[start:start+n] in a doubly linked list of
// the symbols still alive; n == 0 means merged into its left neighbour.
type symbol struct {
	start, n   int
	prev, next int
}

// utf8Len is the length of the UTF-8 sequence that lead byte b announces,
// counting continuation and invalid bytes as 1, as llama.cpp's
// unicode_len_utf8 does.
func utf8Len(b byte) int {
	switch b >> 4 {
	case 0xC, 0xD:
		return 2
	case 0xE:
		return 3
	case 0xF:
		return 4
	}
	return 1
}

// splitSymbols appends one symbol per UTF-8 sequence of text to syms[:0].
func splitSymbols(syms []symbol, text string) []symbol {
	syms = syms[:0]
	for off := 0; off < len(text); {
		n := min(utf8Len(text[off]), len(text)-off)
		syms = append(syms, symbol{start: off, n: n, prev: len(syms) - 1, next: len(syms) + 1})
		off += n
	}
	if len(syms) > 0 {
		syms[len(syms)-1].next = -1
	}
	return syms
}

// merge splits text into UTF-8 characters and merges adjacent symbols,
// the pair of highest score first, for as long as score accepts a pair;
// it returns the symbols, whose survivors form a list from index 0.
func (s *mergeSession) merge(text string, score func(l, r symbol) (float64, bool)) []symbol {
	s.syms = splitSymbols(s.syms, text)
	s.queue = s.queue[:0]
	syms := s.syms
	mergeAll(syms, &s.queue, func(left, right int) {
		if left < 0 || right < 0 {
			return
		}
		l, r := syms[left], syms[right]
		if sc, ok := score(l, r); ok {
			s.queue.push(bigram{left: left, right: right, score: sc, size: l.n + r.n})
		}
	})
	return syms
}

// mergeAll asks add to queue every adjacent pair of syms, then pops
// bigrams until none is left, merging each still-valid pair and asking add
// for the new pairs each merge creates.
func mergeAll(syms []symbol, q *bigramQueue, add func(left, right int)) {
	for i := 1; i < len(syms); i++ {
		add(i-1, i)
	}
	for len(*q) > 0 {
		b := q.pop()
		l, r := &syms[b.left], &syms[b.right]
		if l.n == 0 || r.n == 0 || l.n+r.n != b.size {
			continue // one side changed since the bigram was queued
		}
		l.n += r.n
		r.n = 0
		l.next = r.next
		if r.next >= 0 {
			syms[r.next].prev = b.left
		}
		add(l.prev, b.left)
		add(b.left, l.next)
	}
}

// appendPieces appends the token of each symbol left in syms after
// mergeAll, in order; spell appends the tokens of a symbol whose text is
// not a token.
func appendPieces(out []int32, syms []symbol, text string, toID map[string]int32, spell func(out []int32, piece string) []int32) []int32 {
	for i := 0; i >= 0 && i < len(syms); i = syms[i].next {
		piece := text[syms[i].start : syms[i].start+syms[i].n]
		if id, ok := toID[piece]; ok {
			out = append(out, id)
		} else {
			out = spell(out, piece)
		}
	}
	return out
}
