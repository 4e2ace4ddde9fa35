// Package gguf reads and writes GGUF model files, the single-file format of
// ggml and llama.cpp: a header, typed key/value metadata, tensor infos, and
// the aligned tensor data.
//
// # Reading
//
// Open maps a file read-only (on platforms without mmap support here it
// reads the file instead) and Parse does the same work over bytes already in
// memory. Versions 2 and 3 are read; version 1, whose counts and lengths were
// 32-bit, and big-endian files are refused with ErrUnsupportedVersion.
// Metadata is decoded into Values in file order: scalars unboxed, arrays as
// typed slices (arrays of strings share one backing allocation, so a large
// vocabulary is two allocations), arrays of arrays as []Value. Metadata is
// copied out of the file and outlives Close. Tensor data is not copied:
// TensorData returns a slice of the mapping, valid until Close.
//
// Tensor dimensions are kept in ggml order: Dims[0] (ne0) is the row length,
// the contiguous dimension. TensorInfo.Offset is absolute in the file; the
// data section starts at File.DataOffset, the end of the tensor infos rounded
// up to the alignment (general.alignment, default 32).
//
// # Validation
//
// Parse checks the whole structure before returning a File, so callers can
// use every field without further checks:
//
//   - every field read lies inside the file;
//   - every count (metadata entries, tensors, array elements) is bounded by
//     the bytes that remain divided by the fewest bytes one element can
//     occupy, before anything is allocated; so a header claiming 2^40 tensors
//     or a string of 2^62 bytes fails at once, and the memory Parse allocates
//     is at most a small multiple of the file size;
//   - value type ids, tensor type ids (those kernels/quant knows) and bool
//     bytes (0 or 1) are valid; arrays nest at most MaxArrayDepth deep;
//   - keys and tensor names are non-empty, unique and within the
//     specification's lengths;
//   - tensors have at most MaxDims dimensions, each dimension and the
//     element count fit in an int64, and the row length is a whole number of
//     quantization blocks;
//   - general.alignment, if present, is a positive power of two integer;
//   - tensor offsets are multiples of the alignment, every tensor's data
//     ends inside the file, and no two tensors' data overlap.
//
// Strings are not checked for valid UTF-8: some vocabularies hold byte
// sequences that are not, and they are kept exactly as stored.
//
// A malformed file yields a *FormatError that names the part of the file at
// fault (`header`, `key "general.alignment"`, `tensor "blk.3.attn_q.weight"`),
// the byte offset where one applies, and what is wrong; it wraps one of the
// Err sentinels for errors.Is. No input makes Parse panic.
//
// # Writing
//
// Writer builds a version 3 file from metadata and tensors added in order,
// applying the same rules, so its output always parses; WriteFile replaces
// the destination atomically.
package gguf
