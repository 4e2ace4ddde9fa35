package cuda

import "errors"

// Options configures [New].
type Options struct {
	// Device is the ordinal of the GPU to use, 0 for the first.
	Device int
	// PTX, when not empty, is PTX compiled from kernels.cu that New loads
	// instead of the embedded files: for a GPU they do not serve, or to try
	// a change to kernels.cu without rebuilding.
	PTX string
}

var (
	// ErrNotBuilt is New's error in a build without the cuda build tag.
	ErrNotBuilt = errors.New("kernels/cuda: built without CUDA (build tag cuda)")
	// ErrNoDevice reports that the driver found no GPU of the requested
	// ordinal.
	ErrNoDevice = errors.New("kernels/cuda: no such CUDA device")
)
