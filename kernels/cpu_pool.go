package kernels

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// pool is a fixed set of worker goroutines that the CPU backend splits loops over.
// The goroutine calling run works too, so a pool of n runs n-1 goroutines,
// and a pool of 1 runs none and does everything inline.
//
// A loop is cut into chunks that the participants claim one at a time from
// a shared counter, so a participant that loses its core (another process,
// the garbage collector) delays the loop by at most the chunk it holds
// while the others take the rest (a helper that starts late finds the
// chunks taken and signs off at once). Waiting for the helpers is blocking
// (a WaitGroup). An idle worker polls for the next loop for spinWait, then
// blocks: a parked pool costs nothing, and a pool with more workers than
// free cores slows down instead of collapsing.
// Tasks never wait on other tasks, so concurrent callers cannot deadlock.
type pool struct {
	n     int
	wake  []chan *job // one per worker goroutine
	wg    sync.WaitGroup
	jobs  sync.Pool // *job
	round atomic.Uint32
}

// task is a loop body: run handles items [lo, hi) as participant part
// (0 ≤ part < pool.n, so that per-part scratch space can be indexed).
// Passing a pointer to a long-lived struct as the task keeps a loop free
// of allocations.
type task interface {
	run(part, lo, hi int)
}

// taskFunc adapts a function to task.
type taskFunc func(part, lo, hi int)

func (f taskFunc) run(part, lo, hi int) { f(part, lo, hi) }

// job is one loop handed to the pool.
type job struct {
	t            task
	total, chunk int
	next         atomic.Int64 // index of the next unclaimed chunk
	helpers      sync.WaitGroup
}

func newPool(n int) *pool {
	p := &pool{n: max(n, 1)}
	p.wake = make([]chan *job, p.n-1)
	for i := range p.wake {
		// One slot: a caller never blocks handing work to a busy worker.
		ch := make(chan *job, 1)
		p.wake[i] = ch
		p.wg.Go(func() {
			for {
				j, ok := awaitJob(ch, spinWait)
				if !ok {
					return
				}
				j.work(i + 1)
				j.helpers.Done()
			}
		})
	}
	return p
}

// work claims and runs chunks until none is left.
func (j *job) work(part int) {
	for {
		lo := int(j.next.Add(1)-1) * j.chunk
		if lo >= j.total {
			return
		}
		j.t.run(part, lo, min(lo+j.chunk, j.total))
	}
}

// run calls t.run over [0, total) in chunks of chunk items (the last may be
// shorter), spread over the caller and the workers, and returns when every
// chunk is done. Chunk boundaries are multiples of chunk whatever the
// number of participants.
func (p *pool) run(total, chunk int, t task) {
	if total <= 0 {
		return
	}
	chunk = max(chunk, 1)
	chunks := (total + chunk - 1) / chunk
	if p.n == 1 || chunks == 1 {
		t.run(0, 0, total)
		return
	}
	j, _ := p.jobs.Get().(*job)
	if j == nil {
		j = new(job)
	}
	j.t, j.total, j.chunk = t, total, chunk
	j.next.Store(0)
	// Start with a different worker each time, so that concurrent callers
	// with few chunks do not all queue on the first one.
	helpers := min(p.n-1, chunks-1)
	first := int(p.round.Add(1))
	for k := range helpers {
		j.helpers.Add(1)
		select {
		case p.wake[(first+k)%len(p.wake)] <- j:
		default: // busy with another caller's loop: do without it
			j.helpers.Done()
		}
	}
	j.work(0)
	j.helpers.Wait()
	j.t = nil
	p.jobs.Put(j)
}

// parallel splits [0, total) into chunks of at least grain items, a few
// per participant so that uneven items balance out, and calls
// t.run(part, lo, hi) for each, concurrently; part numbers are 0…n-1 (to
// index per-part scratch space). It returns when all chunks are done.
func (p *pool) parallel(total, grain int, t task) {
	chunk := max(grain, 1, (total+4*p.n-1)/(4*p.n))
	p.run(total, chunk, t)
}

// close stops the workers and waits for them to exit. No run may be in
// progress or start afterwards.
func (p *pool) close() {
	for _, ch := range p.wake {
		close(ch)
	}
	p.wg.Wait()
}

// spinWait is how long an idle worker keeps polling for the next loop
// before it parks. A decoding step hands the pool a loop every few hundred
// microseconds with short serial stretches between them (norms, rotary
// embedding, the KV write), and waking a parked thread takes tens of
// microseconds on a virtual machine: polling through those gaps added
// 5-10% to the 110M model's decode on two cores. The poll yields to other
// goroutines and gives up after spinWait, so an idle pool, or one whose
// core another process holds, costs at most that much per loop; the caller
// never waits for a worker to show up (it claims the chunks itself).
const spinWait = 20 * time.Microsecond

// awaitJob returns the next loop handed to a worker, polling ch for up to
// spin before blocking on it; ok is false once ch is closed.
func awaitJob(ch chan *job, spin time.Duration) (j *job, ok bool) {
	deadline := time.Now().Add(spin)
	for k := 0; spin > 0; k++ {
		select {
		case j, ok = <-ch:
			return j, ok
		default:
		}
		// Reading the clock costs more than polling: every 64 polls.
		if k%64 == 63 {
			if time.Now().After(deadline) {
				break
			}
			runtime.Gosched()
		}
	}
	j, ok = <-ch
	return j, ok
}
