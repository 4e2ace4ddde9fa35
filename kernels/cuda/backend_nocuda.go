//go:build !cuda

package cuda

import "github.com/baton-serving/baton/kernels"

// New would open a GPU; this build has no CUDA support and always returns
// ErrNotBuilt. Build with -tags cuda (see the package documentation).
func New(Options) (kernels.Backend, error) { return nil, ErrNotBuilt }
