package kernels

import (
	"sync"
	"sync/atomic"
)

// workPool is the CPU backend's fixed set of worker goroutines. A loop is
// cut into chunks that the participants (the caller and any idle workers)
// claim one at a time from a shared counter, so a participant that loses
// its core delays the loop by at most one chunk while the others take the
// rest. Workers wait on channels, never spin: an idle pool costs nothing,
// and more workers than free cores slow a loop down instead of stalling
// it. Only idle workers take part (the hand-off channels are unbuffered),
// so concurrent callers never wait on each other's loops.
type workPool struct {
	n     int // participants: the caller plus n-1 workers
	wake  []chan *poolJob
	wg    sync.WaitGroup
	jobs  sync.Pool // *poolJob
	round atomic.Uint32
}

// poolJob is one loop handed to the pool.
type poolJob struct {
	fn           func(lo, hi int)
	total, chunk int
	next         atomic.Int64
	helpers      sync.WaitGroup
}

func newWorkPool(n int) *workPool {
	p := &workPool{n: max(n, 1)}
	p.wake = make([]chan *poolJob, p.n-1)
	for i := range p.wake {
		ch := make(chan *poolJob)
		p.wake[i] = ch
		p.wg.Go(func() {
			for j := range ch {
				j.work()
				j.helpers.Done()
			}
		})
	}
	return p
}

func (j *poolJob) work() {
	for {
		lo := int(j.next.Add(1)-1) * j.chunk
		if lo >= j.total {
			return
		}
		j.fn(lo, min(lo+j.chunk, j.total))
	}
}

// run calls fn(lo, hi) over [0, total) in chunks of chunk items whose
// boundaries are multiples of chunk, spread over the caller and the idle
// workers, and returns when all are done.
func (p *workPool) run(total, chunk int, fn func(lo, hi int)) {
	if total <= 0 {
		return
	}
	chunk = max(chunk, 1)
	chunks := (total + chunk - 1) / chunk
	if p.n == 1 || chunks == 1 {
		fn(0, total)
		return
	}
	j, _ := p.jobs.Get().(*poolJob)
	if j == nil {
		j = new(poolJob)
	}
	j.fn, j.total, j.chunk = fn, total, chunk
	j.next.Store(0)
	first := int(p.round.Add(1))
	for k := range min(p.n-1, chunks-1) {
		j.helpers.Add(1)
		select {
		case p.wake[(first+k)%len(p.wake)] <- j:
		default: // busy with another loop: do without it
			j.helpers.Done()
		}
	}
	j.work()
	j.helpers.Wait()
	j.fn = nil
	p.jobs.Put(j)
}

// close stops the workers; no run may be in progress or follow.
func (p *workPool) close() {
	for _, ch := range p.wake {
		close(ch)
	}
	p.wg.Wait()
}
