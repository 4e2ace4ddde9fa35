//go:build !race

package model

// raceEnabled reports a -race build, in which sync.Pool drops some items
// on purpose.
const raceEnabled = false
