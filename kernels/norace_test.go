//go:build !race

package kernels

// raceEnabled reports a -race build, in which sync.Pool drops some items
// on purpose.
const raceEnabled = false
