package engine

import "errors"

// Sentinel errors that the services map to gRPC status codes in one table
// (svckit). Wrap them with fmt.Errorf("...: %w", ErrX) to add detail.
var (
	// ErrInvalidInput means a caller-supplied value is out of range or malformed.
	ErrInvalidInput = errors.New("invalid input")
	// ErrUnsupported means the model file uses an architecture, tensor type or
	// feature this engine does not implement.
	ErrUnsupported = errors.New("unsupported")
	// ErrContextOverflow means a sequence would exceed the model's context window.
	ErrContextOverflow = errors.New("context window exceeded")
	// ErrKVCacheFull means no KV cache pages are free for the request.
	ErrKVCacheFull = errors.New("kv cache full")
)
