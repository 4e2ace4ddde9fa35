package vec

import (
	"fmt"
	"slices"
)

// Implementations names the implementations this build can run on this
// CPU, the one chosen at initialisation first: on amd64 "avx512" (with
// AVX-512 BW, DQ, VL and VNNI), "avx2" (with FMA and F16C), then
// "purego"; "purego" alone elsewhere and under the purego build tag.
func Implementations() []string {
	var names []string
	for _, im := range impls() {
		names = append(names, im.name)
	}
	return names
}

// SetImplementation makes every function of the package run the named
// implementation (one of [Implementations]) and returns a function that
// restores the one before. It is a hook for the tests of packages built
// on these kernels, so that they cover every implementation the CPU has,
// not only the preferred one (package kernels runs its attention and
// matrix-product tests over each). It changes package state that every
// kernel reads: calling it, or the restore function, while a kernel runs
// in another goroutine is a data race.
func SetImplementation(name string) (restore func(), err error) {
	all := impls()
	i := slices.IndexFunc(all, func(im *impl) bool { return im.name == name })
	if i < 0 {
		return nil, fmt.Errorf("vec: no implementation %q in this build on this CPU (it has %v)", name, Implementations())
	}
	prev := active
	active = all[i]
	return func() { active = prev }, nil
}
