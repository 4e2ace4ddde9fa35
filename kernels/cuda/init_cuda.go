//go:build cuda

package cuda

/*
#cgo LDFLAGS: -Wl,--wrap=cuInit
int baton_cu_init_status(void);
*/
import "C"

import "fmt"

// initErr is the driver's answer to the cuInit that gorgonia.org/cu made
// when the program started (initwrap.c keeps it): nil when the driver
// works, else an error wrapping ErrNoDevice that says why (the toolkit's
// stub library instead of a driver, a driver too old, no GPU).
func initErr() error {
	r := int(C.baton_cu_init_status())
	if r == 0 {
		return nil
	}
	why := map[int]string{
		34:  "the CUDA stub library, not a driver (CUDA_ERROR_STUB_LIBRARY)",
		35:  "the driver is older than this CUDA runtime (CUDA_ERROR_INSUFFICIENT_DRIVER)",
		100: "no CUDA-capable GPU (CUDA_ERROR_NO_DEVICE)",
		101: "invalid device (CUDA_ERROR_INVALID_DEVICE)",
		999: "unknown error (CUDA_ERROR_UNKNOWN)",
	}[r]
	if why == "" {
		why = "CUresult " + fmt.Sprint(r)
	}
	return fmt.Errorf("%w: the CUDA driver did not start: %s", ErrNoDevice, why)
}
