package benchengine

import (
	"sync"
	"time"

	"github.com/baton-serving/baton/kernels/vec"
)

// readBandwidth measures the machine's memory read bandwidth, the ceiling
// of a decoding step, in bytes per second: threads goroutines each stream
// their contiguous share of a buffer of size bytes (far larger than the
// caches) through the engine's own SIMD dot product, as a STREAM-style
// "read" kernel does, and the best of passes timed passes is returned. Its
// figures match those of a C read loop with the same threads on the
// machines measured, so decode's tg_gb_per_second divided by it says how
// close decoding comes to the ceiling.
func readBandwidth(size int64, threads, passes int) float64 {
	threads = max(threads, 1)
	n := int(size / 4)
	per := n / threads &^ 63
	buf := make([]float32, per*threads)
	var sink float32
	run := func(fn func(part []float32) float32) {
		var wg sync.WaitGroup
		sums := make([]float32, threads)
		for i := range threads {
			wg.Go(func() { sums[i] = fn(buf[i*per : (i+1)*per]) })
		}
		wg.Wait()
		for _, s := range sums {
			sink += s
		}
	}
	// Touch every page first, from the goroutine that will read it.
	run(func(part []float32) float32 {
		for i := range part {
			part[i] = 1
		}
		return 0
	})
	var best float64
	for range max(passes, 1) {
		start := time.Now()
		run(func(part []float32) float32 { return vec.DotF32(part, part) })
		best = max(best, float64(4*len(buf))/time.Since(start).Seconds())
	}
	if sink < 0 { // keeps the sums live; never true
		best = 0
	}
	return best
}
