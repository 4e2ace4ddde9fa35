//go:build !unix

package benchengine

// maxRSS is not available on this system.
func maxRSS() int64 { return 0 }
