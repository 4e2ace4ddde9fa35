//go:build purego || !amd64

package vec

func chooseImpl() *impl { return genericImpl }

// impls lists every implementation this build can run on this CPU, the
// preferred one first.
func impls() []*impl { return []*impl{genericImpl} }
