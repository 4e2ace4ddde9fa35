package workers

import "slices"

// The Pairer's filters. Each is a loop of its own, with no call per worker
// through an interface or a closure: a pick looks at every worker.

// readyFilter keeps the workers that may take new requests at now (unix
// nanos): in their set, ready by a report younger than stale.
type readyFilter struct{ now, stale int64 }

func (readyFilter) Name() string { return FilterReady }

func (f *readyFilter) Filter(ws []*Worker) []*Worker {
	out := ws[:0]
	for _, w := range ws {
		if w.routable(f.now, f.stale) {
			out = append(out, w)
		}
	}
	return out
}

// capacityFilter keeps the workers below limit router requests (0: all).
type capacityFilter struct{ limit int64 }

func (capacityFilter) Name() string { return FilterCapacity }

func (f *capacityFilter) Filter(ws []*Worker) []*Worker {
	if f.limit <= 0 {
		return ws
	}
	out := ws[:0]
	for _, w := range ws {
		if w.inflight.Load() < f.limit {
			out = append(out, w)
		}
	}
	return out
}

// untriedFilter drops the workers whose address is in avoid.
type untriedFilter struct{ avoid []string }

func (untriedFilter) Name() string { return FilterUntried }

func (f *untriedFilter) Filter(ws []*Worker) []*Worker {
	out := ws[:0]
	for _, w := range ws {
		if !slices.Contains(f.avoid, w.Addr) {
			out = append(out, w)
		}
	}
	return out
}

// excludeFilter drops the workers in *list, which grows during a pick.
type excludeFilter struct {
	name string
	list *[]*Worker
}

func (f *excludeFilter) Name() string { return f.name }

func (f *excludeFilter) Filter(ws []*Worker) []*Worker {
	if len(*f.list) == 0 {
		return ws
	}
	out := ws[:0]
	for _, w := range ws {
		if !slices.Contains(*f.list, w) {
			out = append(out, w)
		}
	}
	return out
}

// layoutFilter keeps the prefill workers whose KV layout is *decode's.
type layoutFilter struct{ decode **Worker }

func (layoutFilter) Name() string { return FilterLayout }

func (f *layoutFilter) Filter(ws []*Worker) []*Worker {
	d := (*f.decode).Info()
	out := ws[:0]
	for _, w := range ws {
		if LayoutCompatible(w.Info(), d) {
			out = append(out, w)
		}
	}
	return out
}
