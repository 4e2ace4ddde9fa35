//go:build purego || !amd64

package vec

// roundImpls lists the rounding implementations, the preferred one first.
func roundImpls() []roundImpl { return []roundImpl{roundGeneric} }
