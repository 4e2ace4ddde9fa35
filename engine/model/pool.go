package model

import "sync"

// pool is a fixed set of worker goroutines that a model splits loops over.
// The goroutine calling parallel works too, so a pool of n runs n-1
// goroutines, and a pool of 1 runs none and does everything inline.
// Tasks never wait on other tasks, so concurrent callers cannot deadlock.
type pool struct {
	n     int
	tasks chan func()
	wg    sync.WaitGroup
}

func newPool(n int) *pool {
	p := &pool{n: max(n, 1), tasks: make(chan func())}
	for range p.n - 1 {
		p.wg.Go(func() {
			for f := range p.tasks {
				f()
			}
		})
	}
	return p
}

// parallel splits [0, total) into at most p.n contiguous parts of at least
// grain items each and calls fn(part, lo, hi) for each, concurrently; part
// numbers are 0…parts-1 (to index per-part scratch space). It returns when
// all parts are done.
func (p *pool) parallel(total, grain int, fn func(part, lo, hi int)) {
	if total <= 0 {
		return
	}
	parts := min(p.n, max(1, total/max(grain, 1)))
	if parts == 1 {
		fn(0, 0, total)
		return
	}
	var wg sync.WaitGroup
	for i := 1; i < parts; i++ {
		lo, hi := total*i/parts, total*(i+1)/parts
		wg.Add(1)
		p.tasks <- func() {
			defer wg.Done()
			fn(i, lo, hi)
		}
	}
	fn(0, 0, total/parts)
	wg.Wait()
}

// close stops the workers and waits for them to exit. No parallel call may
// be running or start afterwards.
func (p *pool) close() {
	close(p.tasks)
	p.wg.Wait()
}
