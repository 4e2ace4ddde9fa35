package workers

import (
	"fmt"
	"strings"
	"sync"
	"time"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
)

// PairGate says whether a (prefill, decode) pair may take traffic; the
// canary's quarantine is one. In colocated mode the prefill is "".
type PairGate interface {
	Allowed(prefill, decode string) bool
}

// The filters a Pairer applies, by the names Rejections report.
const (
	FilterReady    = "ready"
	FilterUntried  = "untried by this request"
	FilterPartner  = "paired with a usable prefill worker"
	FilterCanary   = "in a pair that passes its canary"
	FilterLayout   = "of the decode worker's KV layout"
	FilterCapacity = "below its in-flight limit"
)

// Pairer picks (prefill, decode) pairs.
type Pairer struct {
	Prefill *Set // nil: colocated mode, decode computes prompts itself
	Decode  *Set

	PrefillPolicy, DecodePolicy *Policy

	// Gate, when set, vetoes pairs (the canary's quarantine).
	Gate PairGate
	// MaxInflight caps the router's requests on each worker; 0 is no cap.
	MaxInflight int
}

// Pair is a picked pair. Its workers count the request until it is
// released.
type Pair struct {
	Prefill *Worker // nil in colocated mode
	Decode  *Worker

	mu     sync.Mutex
	holdsP bool // the request still counts on Prefill
	holdsD bool // and on Decode
}

// PrefillAddr is the prefill endpoint decode is told to use: the prefill
// worker's address, or "local" in colocated mode.
func (p *Pair) PrefillAddr() string {
	if p.Prefill == nil {
		return LocalPrefill
	}
	return p.Prefill.Addr
}

// LocalPrefill is the prefill endpoint that asks decode to compute the
// prompt itself (colocated mode).
const LocalPrefill = "local"

// ReleasePrefill stops counting the request on its prefill worker (its part
// ends with the KV transfer). It is safe to call more than once.
func (p *Pair) ReleasePrefill() { p.let(&p.holdsP, p.Prefill) }

// Release stops counting the request on both workers; safe to call more
// than once.
func (p *Pair) Release() {
	p.ReleasePrefill()
	p.let(&p.holdsD, p.Decode)
}

// let releases w if the pair still holds it (*holds, under mu), once.
func (p *Pair) let(holds *bool, w *Worker) {
	p.mu.Lock()
	held := *holds
	*holds = false
	p.mu.Unlock()
	if held {
		w.release()
	}
}

// PickError says why no pair could be picked.
type PickError struct {
	// Role is the side that had no usable worker.
	Role batonv1.WorkerRole
	// Full: every worker that could otherwise have taken the request is
	// at its in-flight limit (Limit).
	Full  bool
	Limit int
	// Rejected says why each worker of Role was ruled out.
	Rejected Rejections
	// Decode names the decode worker whose prefill partners Rejected are,
	// when the prefill side failed.
	Decode string
	// Source is where Role's workers are looked for.
	Source string
}

func (e *PickError) Error() string {
	role := RoleName(e.Role)
	if e.Full {
		return fmt.Sprintf("every %s worker that could take the request is at its in-flight limit of %d", role, e.Limit)
	}
	if len(e.Rejected) == 0 {
		return fmt.Sprintf("no ready %s worker (none found at %s)", role, e.Source)
	}
	if e.Decode != "" {
		return fmt.Sprintf("no ready prefill worker for decode %s (%s)", e.Decode, e.Rejected)
	}
	return fmt.Sprintf("no ready %s worker (%s)", role, e.Rejected)
}

// Pick chooses a pair for a request and counts the request on its workers.
// Workers in avoid (addresses already tried by this request) are used only
// when no other pair is possible, and each role avoids them on its own: a
// retry with one decode worker goes back to it, but still with another
// prefill worker if there is one (the failed one may be dead without the
// router knowing yet). The error is a *PickError.
//
// q is the request (nil: unknown), for the policies that score by what it
// asks, as cache-aware does by its prompt.
func (pp *Pairer) Pick(q *Query, avoid []string) (*Pair, error) {
	if len(avoid) > 0 {
		for _, a := range [...]struct{ d, p []string }{{avoid, avoid}, {nil, avoid}, {avoid, nil}} {
			if p, err := pp.pick(q, a.d, a.p); err == nil {
				return p, nil
			}
		}
	}
	return pp.pick(q, nil, nil)
}

// pickState is one pick's filters, allocated together.
type pickState struct {
	readyD, readyP      readyFilter
	capacity            capacityFilter
	untriedD, untriedP  untriedFilter
	noPartner, denied   excludeFilter
	layout              layoutFilter
	dc                  *Worker // the decode worker the prefill filters pair with
	noPartners, denieds []*Worker
	dFilters, pFilters  []Filter
	dBuf, pBuf          [5]Filter
}

// pick chooses a pair with decode workers outside avoidD and prefill
// workers outside avoidP.
func (pp *Pairer) pick(q *Query, avoidD, avoidP []string) (*Pair, error) {
	now := time.Now().UnixNano()
	limit := int64(pp.MaxInflight)
	st := &pickState{capacity: capacityFilter{limit}, untriedD: untriedFilter{avoidD}, untriedP: untriedFilter{avoidP}}
	st.layout.decode = &st.dc

	// The gate may be costly, so it is asked about the chosen worker only:
	// a worker it refuses is ruled out and the policy chooses again among
	// the rest, which is the choice it would have made had the gate been a
	// filter. Decodes without a usable partner are ruled out the same way.
	st.readyD = readyFilter{now, int64(pp.Decode.staleAfter)}
	st.noPartner = excludeFilter{FilterPartner, &st.noPartners}
	if pp.Prefill == nil {
		st.noPartner.name = FilterCanary
	}
	st.dFilters = append(st.dBuf[:0], &st.readyD)
	if len(avoidD) > 0 {
		st.dFilters = append(st.dFilters, &st.untriedD)
	}
	st.dFilters = append(st.dFilters, &st.noPartner, &st.capacity)
	if pp.Prefill != nil {
		st.readyP = readyFilter{now, int64(pp.Prefill.staleAfter)}
		st.denied = excludeFilter{FilterCanary, &st.denieds}
		st.pFilters = append(st.pBuf[:0], &st.readyP)
		if len(avoidP) > 0 {
			st.pFilters = append(st.pFilters, &st.untriedP)
		}
		st.pFilters = append(st.pFilters, &st.layout, &st.denied, &st.capacity)
	}
	var lastPrefill *PickError
	decodes := pp.Decode.Workers()
	var prefills []*Worker
	if pp.Prefill != nil {
		prefills = pp.Prefill.Workers()
	}
	for races := 0; races < 3; {
		d, rej := pp.DecodePolicy.Pick(q, decodes, st.dFilters)
		if d == nil {
			if lastPrefill != nil && rej.Only(FilterPartner) {
				return nil, lastPrefill
			}
			return nil, pp.pickError(pp.Decode, rej, "", lastPrefill)
		}
		if pp.Prefill == nil && pp.Gate != nil && !pp.Gate.Allowed("", d.Addr) {
			st.noPartners = append(st.noPartners, d)
			continue
		}
		var pf *Worker
		if pp.Prefill != nil {
			st.dc, st.denieds = d, st.denieds[:0]
			for {
				var prej Rejections
				if pf, prej = pp.PrefillPolicy.Pick(q, prefills, st.pFilters); pf == nil {
					lastPrefill = pp.pickError(pp.Prefill, prej, d.Addr, nil)
					break
				}
				if pp.Gate == nil || pp.Gate.Allowed(pf.Addr, d.Addr) {
					break
				}
				st.denieds = append(st.denieds, pf)
			}
			if pf == nil {
				if !lastPrefill.Rejected.Any(FilterLayout) && !lastPrefill.Rejected.Any(FilterCanary) {
					// Nothing about d ruled the prefill workers out:
					// no other decode worker would fare better.
					return nil, lastPrefill
				}
				st.noPartners = append(st.noPartners, d)
				continue
			}
		}
		if err := d.tryAcquire(limit); err != nil {
			races++ // filled or retired since the filter saw it: pick again
			continue
		}
		if pf != nil {
			if err := pf.tryAcquire(limit); err != nil {
				d.release()
				races++
				continue
			}
		}
		return &Pair{Prefill: pf, Decode: d, holdsP: pf != nil, holdsD: true}, nil
	}
	// Every turn lost its race for a slot: the workers are full, or
	// leaving the set as fast as they are picked.
	return nil, &PickError{Role: batonv1.WorkerRole_WORKER_ROLE_DECODE, Full: limit > 0, Limit: pp.MaxInflight,
		Source: pp.Decode.Source().String()}
}

// pickError builds the error for role's rejections. A side is full when
// some worker passed every filter but the in-flight limit (the last filter),
// or when its partners' side was.
func (pp *Pairer) pickError(s *Set, rej Rejections, decode string, partner *PickError) *PickError {
	e := &PickError{Role: s.Role(), Rejected: rej, Decode: decode, Limit: pp.MaxInflight, Source: s.Source().String()}
	if rej.Any(FilterCapacity) {
		e.Full = true
		return e
	}
	if partner != nil && partner.Full {
		return partner
	}
	return e
}

// LayoutCompatible reports whether a prefill worker and a decode worker
// store their KV caches alike, so that one can send the other its pages.
// A worker that reports no layout is taken at its word.
func LayoutCompatible(a, b *batonv1.InfoResponse) bool {
	la, lb := a.GetKvLayout(), b.GetKvLayout()
	if la == nil || lb == nil {
		return true
	}
	return la.GetDtype() == lb.GetDtype() && la.GetPageSizeTokens() == lb.GetPageSizeTokens() &&
		la.GetNumLayers() == lb.GetNumLayers() && la.GetNumKvHeads() == lb.GetNumKvHeads() && la.GetHeadDim() == lb.GetHeadDim()
}

// Describe lists a set's workers for errors: address and why each is not
// routable, or "ready".
func Describe(s *Set) string {
	ws := s.Workers()
	if len(ws) == 0 {
		return "no workers found at " + s.cfg.Source.String()
	}
	parts := make([]string, 0, len(ws))
	for _, w := range ws {
		why := "ready"
		switch {
		case w.Excluded() != "":
			why = "excluded: " + w.Excluded()
		case !s.Routable(w):
			why = "not ready"
			if e := w.LastError(); e != "" {
				why += " (" + e + ")"
			}
		}
		parts = append(parts, w.Addr+": "+why)
	}
	return strings.Join(parts, "; ")
}
