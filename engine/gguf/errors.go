package gguf

import (
	"errors"
	"fmt"
)

// Sentinel errors classify what is wrong with a file. Every error returned by
// Parse and Open for a malformed file is a *FormatError that wraps exactly one
// of them, so callers can branch with errors.Is without parsing messages.
var (
	// ErrBadMagic means the file does not start with the bytes "GGUF".
	ErrBadMagic = errors.New("bad magic")
	// ErrUnsupportedVersion means the version is not 2 or 3, or the file is
	// a big-endian GGUF.
	ErrUnsupportedVersion = errors.New("unsupported version")
	// ErrTruncated means a field, or the number of fields a count promises,
	// does not fit in the bytes that remain in the file.
	ErrTruncated = errors.New("truncated")
	// ErrBadValueType means a metadata value or array element type id is not
	// one GGUF defines.
	ErrBadValueType = errors.New("unknown metadata value type")
	// ErrBadTensorType means a tensor type id is not a known ggml type.
	ErrBadTensorType = errors.New("unknown tensor type")
	// ErrBadShape means a tensor has too many dimensions, a dimension or
	// element count that overflows, or a first dimension that is not a whole
	// number of quantization blocks.
	ErrBadShape = errors.New("bad tensor shape")
	// ErrBadAlignment means general.alignment is not a positive power of two
	// integer.
	ErrBadAlignment = errors.New("bad alignment")
	// ErrMisaligned means a tensor's data offset is not a multiple of the
	// file's alignment.
	ErrMisaligned = errors.New("misaligned tensor data")
	// ErrOutOfBounds means tensor data extends past the end of the file.
	ErrOutOfBounds = errors.New("tensor data out of bounds")
	// ErrOverlap means the data ranges of two tensors overlap.
	ErrOverlap = errors.New("overlapping tensor data")
	// ErrDuplicate means a metadata key or tensor name occurs twice.
	ErrDuplicate = errors.New("duplicate name")
	// ErrInvalid covers the remaining malformations: empty or over-long
	// names, bool bytes other than 0 and 1, arrays nested too deeply.
	ErrInvalid = errors.New("invalid value")
)

// FormatError reports a malformed GGUF file: what part of it is wrong, where,
// and why. It unwraps to one of the package's sentinel errors.
type FormatError struct {
	// Where names the part of the file, e.g. `header`,
	// `key "general.alignment"` or `tensor "blk.3.attn_q.weight"`.
	Where string
	// Offset is the byte offset in the file at which the problem was found,
	// or -1 when the problem is not tied to one position (for instance two
	// overlapping tensors).
	Offset int64
	// Detail says what is wrong, in words.
	Detail string
	// Err is the sentinel that classifies the problem.
	Err error
}

func (e *FormatError) Error() string {
	if e.Offset >= 0 {
		return fmt.Sprintf("gguf: %s: %s (at byte %d)", e.Where, e.Detail, e.Offset)
	}
	return fmt.Sprintf("gguf: %s: %s", e.Where, e.Detail)
}

func (e *FormatError) Unwrap() error { return e.Err }

// formatErr builds a *FormatError; offset < 0 means "no single position".
func formatErr(sentinel error, where string, offset int64, format string, args ...any) *FormatError {
	return &FormatError{Where: where, Offset: offset, Detail: fmt.Sprintf(format, args...), Err: sentinel}
}
