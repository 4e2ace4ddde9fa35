//go:build race

package sched

// raceEnabled: the race detector slows the model's arithmetic ~30×, so the
// heaviest tests generate fewer tokens under it.
const raceEnabled = true
