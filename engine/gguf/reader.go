package gguf

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/baton-serving/baton/kernels/quant"
)

// Format limits. MaxDims is wider than ggml's 4 so that files from newer
// writers still load; MaxTensorNameLen and MaxKeyLen are the specification's.
const (
	MaxDims          = 8
	MaxTensorNameLen = 64
	MaxKeyLen        = 1<<16 - 1
	DefaultAlignment = 32
)

// AlignmentKey is the metadata key that overrides DefaultAlignment.
const AlignmentKey = "general.alignment"

const (
	magic = "GGUF"
	// initialCap bounds the capacity allocated up front for a count of
	// variable-size records (metadata entries, tensor infos, nested arrays).
	// The count is already bounded by the bytes remaining, but each record
	// takes several times its minimal encoding in memory; growing as records
	// actually decode keeps a lying count from costing that multiple of the
	// file size before the lie is found.
	initialCap = 1 << 14
	// The fewest bytes a metadata entry (empty key, type, one-byte value) and
	// a tensor info (empty name, n_dims 0, type, offset) can occupy.
	minKVSize         = 8 + 4 + 1
	minTensorInfoSize = 8 + 4 + 4 + 8
)

// KV is one metadata entry.
type KV struct {
	Key   string
	Value Value
}

// TensorInfo describes one tensor of a file.
type TensorInfo struct {
	Name string
	// Dims are the dimensions in ggml order: Dims[0] (ne0) is the contiguous
	// one, the row length.
	Dims []uint64
	Type quant.Type
	// Offset is the absolute byte offset of the tensor's data in the file.
	Offset uint64
	// Size is the byte length of the tensor's data.
	Size uint64
}

// NumElements returns the product of the dimensions (1 for no dimensions).
// For a TensorInfo from a parsed File it cannot overflow: Parse checked it.
func (t *TensorInfo) NumElements() uint64 {
	n := uint64(1)
	for _, d := range t.Dims {
		n *= d
	}
	return n
}

// File is a parsed, validated GGUF file. Its metadata is copied out of the
// file bytes and outlives Close; tensor data is not copied (see TensorData).
//
// A File is safe for concurrent reads. Close must not run concurrently with
// TensorData or with uses of the slices it returned.
type File struct {
	Version    uint32
	Alignment  uint64
	DataOffset uint64 // absolute offset of the tensor data section
	KVs        []KV
	Tensors    []TensorInfo

	data    []byte
	size    uint64
	keys    map[string]int
	names   map[string]int
	release func() error // unmaps the file; nil for Parse

	closeOnce sync.Once
	closeErr  error
}

// Parse parses and validates a GGUF file held in memory. It does not copy
// data: tensor slices returned by TensorData alias it, so data must stay
// unchanged while they are in use.
func Parse(data []byte) (*File, error) {
	d := &decoder{buf: data}
	f := &File{data: data, size: uint64(len(data))}
	if err := f.parse(d); err != nil {
		return nil, err
	}
	return f, nil
}

// Close releases the file mapping made by Open; afterwards TensorData returns
// nil and slices it returned before must not be used. Calling Close again
// returns the first call's result.
func (f *File) Close() error {
	f.closeOnce.Do(func() {
		if f.release != nil {
			f.closeErr = f.release()
		}
		f.data = nil
	})
	return f.closeErr
}

// Size returns the length of the file in bytes.
func (f *File) Size() uint64 { return f.size }

// TensorData returns the bytes of t's data: a slice of the file mapping (no
// copy), valid until Close, which callers must not modify (the mapping is
// read-only; writing to it faults). It returns nil after Close or if t does
// not lie inside the file.
func (f *File) TensorData(t *TensorInfo) []byte {
	end, carry := bits.Add64(t.Offset, t.Size, 0)
	if f.data == nil || carry != 0 || end > uint64(len(f.data)) {
		return nil
	}
	return f.data[t.Offset:end:end]
}

// Tensor looks a tensor up by name. The pointer refers into f.Tensors.
func (f *File) Tensor(name string) (*TensorInfo, bool) {
	i, ok := f.names[name]
	if !ok {
		return nil, false
	}
	return &f.Tensors[i], true
}

// Get looks a metadata value up by its full key (for example
// "llama.block_count").
func (f *File) Get(key string) (Value, bool) {
	i, ok := f.keys[key]
	if !ok {
		return Value{}, false
	}
	return f.KVs[i].Value, true
}

// String returns a string value.
func (f *File) String(key string) (string, bool) {
	v, _ := f.Get(key)
	return v.AsString()
}

// Uint returns an integer value of any width as a uint64; negative values
// and non-integers fail.
func (f *File) Uint(key string) (uint64, bool) {
	v, ok := f.Get(key)
	if !ok {
		return 0, false
	}
	return v.AsUint()
}

// Int returns an integer value of any width as an int64; uint64 values above
// math.MaxInt64 and non-integers fail.
func (f *File) Int(key string) (int64, bool) {
	v, ok := f.Get(key)
	if !ok {
		return 0, false
	}
	return v.AsInt()
}

// Float returns a float32, float64 or integer value as a float64.
func (f *File) Float(key string) (float64, bool) {
	v, ok := f.Get(key)
	if !ok {
		return 0, false
	}
	return v.AsFloat()
}

// Bool returns a bool value.
func (f *File) Bool(key string) (bool, bool) {
	v, ok := f.Get(key)
	if !ok {
		return false, false
	}
	return v.AsBool()
}

// Strings returns an array of strings. The slice is shared with f: do not
// modify it.
func (f *File) Strings(key string) ([]string, bool) {
	v, _ := f.Get(key)
	return v.Strings()
}

// Float32s returns an array of float32 (shared with f: do not modify it), or
// an array of float64 converted to a new []float32.
func (f *File) Float32s(key string) ([]float32, bool) {
	v, ok := f.Get(key)
	if !ok {
		return nil, false
	}
	if a, ok := v.Float32s(); ok {
		return a, true
	}
	if a, ok := v.Float64s(); ok {
		out := make([]float32, len(a))
		for i, x := range a {
			out[i] = float32(x)
		}
		return out, true
	}
	return nil, false
}

// Int32s returns an array of int32 (shared with f: do not modify it), or an
// array of any other integer type converted to a new []int32 when every
// element fits in an int32.
func (f *File) Int32s(key string) ([]int32, bool) {
	v, ok := f.Get(key)
	if !ok || v.typ != TypeArray {
		return nil, false
	}
	switch a := v.arr.(type) {
	case []int32:
		return a, true
	case []int8:
		return signedToInt32(a)
	case []int16:
		return signedToInt32(a)
	case []int64:
		return signedToInt32(a)
	case []uint8:
		return unsignedToInt32(a)
	case []uint16:
		return unsignedToInt32(a)
	case []uint32:
		return unsignedToInt32(a)
	case []uint64:
		return unsignedToInt32(a)
	}
	return nil, false
}

func signedToInt32[T int8 | int16 | int64](a []T) ([]int32, bool) {
	out := make([]int32, len(a))
	for i, x := range a {
		if int64(x) < math.MinInt32 || int64(x) > math.MaxInt32 {
			return nil, false
		}
		out[i] = int32(x)
	}
	return out, true
}

func unsignedToInt32[T uint8 | uint16 | uint32 | uint64](a []T) ([]int32, bool) {
	out := make([]int32, len(a))
	for i, x := range a {
		if uint64(x) > math.MaxInt32 {
			return nil, false
		}
		out[i] = int32(x)
	}
	return out, true
}

// loc names the part of a file being decoded. It is formatted only when an
// error is reported, so that decoding a well-formed file builds no strings.
type loc struct {
	kind locKind
	name string // key or tensor name, once read
	idx  int    // entry or tensor index, before the name is known
}

type locKind uint8

const (
	locHeader locKind = iota
	locEntry
	locKey
	locTensorInfo
	locTensor
)

func (l loc) String() string {
	switch l.kind {
	case locEntry:
		return "metadata entry " + strconv.Itoa(l.idx)
	case locKey:
		return "key " + strconv.Quote(l.name)
	case locTensorInfo:
		return "tensor info " + strconv.Itoa(l.idx)
	case locTensor:
		return "tensor " + strconv.Quote(l.name)
	}
	return "header"
}

// decoder reads little-endian fields from buf, tracking the offset. Its
// methods report false when the field does not fit; callers turn that into
// a FormatError naming the field.
type decoder struct {
	buf []byte
	off uint64
}

func (d *decoder) remaining() uint64 { return uint64(len(d.buf)) - d.off }

func (d *decoder) u8() (uint8, bool) {
	if d.remaining() < 1 {
		return 0, false
	}
	v := d.buf[d.off]
	d.off++
	return v, true
}

func (d *decoder) u16() (uint16, bool) {
	if d.remaining() < 2 {
		return 0, false
	}
	v := binary.LittleEndian.Uint16(d.buf[d.off:])
	d.off += 2
	return v, true
}

func (d *decoder) u32() (uint32, bool) {
	if d.remaining() < 4 {
		return 0, false
	}
	v := binary.LittleEndian.Uint32(d.buf[d.off:])
	d.off += 4
	return v, true
}

func (d *decoder) u64() (uint64, bool) {
	if d.remaining() < 8 {
		return 0, false
	}
	v := binary.LittleEndian.Uint64(d.buf[d.off:])
	d.off += 8
	return v, true
}

// truncated reports that a field of n bytes does not fit at the current
// offset.
func (d *decoder) truncated(where loc, field string, n uint64) error {
	return formatErr(ErrTruncated, where.String(), int64(d.off), "%s needs %d bytes but only %d remain", field, n, d.remaining())
}

// str reads a length-prefixed string of at most maxLen bytes, copying it so
// that it outlives the mapping.
func (d *decoder) str(where loc, field string, maxLen uint64) (string, error) {
	start := d.off
	n, ok := d.u64()
	if !ok {
		return "", d.truncated(where, field+" length", 8)
	}
	if n > d.remaining() {
		return "", formatErr(ErrTruncated, where.String(), int64(start), "%s length %d exceeds the %d bytes remaining", field, n, d.remaining())
	}
	if n > maxLen {
		return "", formatErr(ErrInvalid, where.String(), int64(start), "%s is %d bytes long, more than the limit of %d", field, n, maxLen)
	}
	s := string(d.buf[d.off : d.off+n])
	d.off += n
	return s, nil
}

func (f *File) parse(d *decoder) error {
	where := loc{kind: locHeader}
	if uint64(len(d.buf)) < 4 {
		return d.truncated(where, "magic", 4)
	}
	if string(d.buf[:4]) != magic {
		return formatErr(ErrBadMagic, where.String(), 0, "file starts with %q, not %q", d.buf[:4], magic)
	}
	d.off = 4
	version, ok := d.u32()
	if !ok {
		return d.truncated(where, "version", 4)
	}
	switch {
	case version == 2 || version == 3:
	case version == 1:
		return formatErr(ErrUnsupportedVersion, where.String(), 4, "GGUF version 1 is not supported (only versions 2 and 3)")
	case bits.ReverseBytes32(version) >= 1 && bits.ReverseBytes32(version) <= 3:
		return formatErr(ErrUnsupportedVersion, where.String(), 4, "big-endian GGUF (version %d) is not supported", bits.ReverseBytes32(version))
	default:
		return formatErr(ErrUnsupportedVersion, where.String(), 4, "version %d is not supported (only versions 2 and 3)", version)
	}
	f.Version = version

	nTensors, ok := d.u64()
	if !ok {
		return d.truncated(where, "tensor count", 8)
	}
	nKV, ok := d.u64()
	if !ok {
		return d.truncated(where, "metadata count", 8)
	}
	// Bound both counts by the bytes that remain before allocating anything
	// sized by them.
	rem := d.remaining()
	if nKV > rem/minKVSize {
		return formatErr(ErrTruncated, where.String(), 16, "%d metadata entries need at least %d bytes each, but only %d bytes remain", nKV, minKVSize, rem)
	}
	rem -= nKV * minKVSize
	if nTensors > rem/minTensorInfoSize {
		return formatErr(ErrTruncated, where.String(), 8, "%d tensors need at least %d bytes each, but at most %d bytes remain after the metadata", nTensors, minTensorInfoSize, rem)
	}

	if err := f.parseKVs(d, int(nKV)); err != nil {
		return err
	}
	if err := f.setAlignment(); err != nil {
		return err
	}
	if err := f.parseTensorInfos(d, int(nTensors)); err != nil {
		return err
	}
	return f.placeTensors(d.off)
}

func (f *File) parseKVs(d *decoder, n int) error {
	f.KVs = make([]KV, 0, min(n, initialCap))
	f.keys = make(map[string]int, min(n, initialCap))
	for i := range n {
		where := loc{kind: locEntry, idx: i}
		start := d.off
		key, err := d.str(where, "key", MaxKeyLen)
		if err != nil {
			return err
		}
		if key == "" {
			return formatErr(ErrInvalid, where.String(), int64(start), "empty key")
		}
		where = loc{kind: locKey, name: key}
		if _, dup := f.keys[key]; dup {
			return formatErr(ErrDuplicate, where.String(), int64(start), "key occurs more than once")
		}
		t, ok := d.u32()
		if !ok {
			return d.truncated(where, "value type", 4)
		}
		v, err := d.value(where, ValueType(t), 0)
		if err != nil {
			return err
		}
		f.keys[key] = len(f.KVs)
		f.KVs = append(f.KVs, KV{Key: key, Value: v})
	}
	return nil
}

// value decodes one value of type t; depth is how many arrays enclose it.
func (d *decoder) value(where loc, t ValueType, depth int) (Value, error) {
	start := int64(d.off) - 4 // the type id just read
	switch t {
	case TypeUint8, TypeInt8, TypeBool:
		x, ok := d.u8()
		if !ok {
			return Value{}, d.truncated(where, t.String()+" value", 1)
		}
		switch t {
		case TypeInt8:
			return Value{typ: t, num: uint64(int64(int8(x)))}, nil
		case TypeBool:
			if x > 1 {
				return Value{}, formatErr(ErrInvalid, where.String(), int64(d.off-1), "bool byte is %d, not 0 or 1", x)
			}
		}
		return Value{typ: t, num: uint64(x)}, nil
	case TypeUint16, TypeInt16:
		x, ok := d.u16()
		if !ok {
			return Value{}, d.truncated(where, t.String()+" value", 2)
		}
		if t == TypeInt16 {
			return Value{typ: t, num: uint64(int64(int16(x)))}, nil
		}
		return Value{typ: t, num: uint64(x)}, nil
	case TypeUint32, TypeInt32, TypeFloat32:
		x, ok := d.u32()
		if !ok {
			return Value{}, d.truncated(where, t.String()+" value", 4)
		}
		if t == TypeInt32 {
			return Value{typ: t, num: uint64(int64(int32(x)))}, nil
		}
		return Value{typ: t, num: uint64(x)}, nil
	case TypeUint64, TypeInt64, TypeFloat64:
		x, ok := d.u64()
		if !ok {
			return Value{}, d.truncated(where, t.String()+" value", 8)
		}
		return Value{typ: t, num: x}, nil
	case TypeString:
		s, err := d.str(where, "string value", math.MaxUint64)
		if err != nil {
			return Value{}, err
		}
		return Value{typ: t, str: s}, nil
	case TypeArray:
		return d.array(where, depth+1)
	}
	return Value{}, formatErr(ErrBadValueType, where.String(), start, "value type id %d is not a GGUF type", uint32(t))
}

// array decodes an array body (element type, count, elements) at nesting
// depth depth.
func (d *decoder) array(where loc, depth int) (Value, error) {
	start := d.off
	et32, ok := d.u32()
	if !ok {
		return Value{}, d.truncated(where, "array element type", 4)
	}
	et := ValueType(et32)
	if !et.Valid() {
		return Value{}, formatErr(ErrBadValueType, where.String(), int64(start), "array element type id %d is not a GGUF type", et32)
	}
	if depth > MaxArrayDepth {
		return Value{}, formatErr(ErrInvalid, where.String(), int64(start), "arrays nest more than %d deep", MaxArrayDepth)
	}
	n, ok := d.u64()
	if !ok {
		return Value{}, d.truncated(where, "array length", 8)
	}
	elemMin := et.minEncodedSize()
	if n > d.remaining()/elemMin {
		return Value{}, formatErr(ErrTruncated, where.String(), int64(start+4), "array of %d %s elements needs at least %d bytes each, but only %d bytes remain", n, et, elemMin, d.remaining())
	}
	// From here n*min <= remaining <= len(buf), so n fits in an int and every
	// slice below is bounded by the file size.
	switch et {
	case TypeUint8:
		return arrayValueOwned(decodeFixed(d, n, 1, func(b []byte) uint8 { return b[0] })), nil
	case TypeInt8:
		return arrayValueOwned(decodeFixed(d, n, 1, func(b []byte) int8 { return int8(b[0]) })), nil
	case TypeUint16:
		return arrayValueOwned(decodeFixed(d, n, 2, binary.LittleEndian.Uint16)), nil
	case TypeInt16:
		return arrayValueOwned(decodeFixed(d, n, 2, func(b []byte) int16 { return int16(binary.LittleEndian.Uint16(b)) })), nil
	case TypeUint32:
		return arrayValueOwned(decodeFixed(d, n, 4, binary.LittleEndian.Uint32)), nil
	case TypeInt32:
		return arrayValueOwned(decodeFixed(d, n, 4, func(b []byte) int32 { return int32(binary.LittleEndian.Uint32(b)) })), nil
	case TypeFloat32:
		return arrayValueOwned(decodeFixed(d, n, 4, func(b []byte) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(b)) })), nil
	case TypeUint64:
		return arrayValueOwned(decodeFixed(d, n, 8, binary.LittleEndian.Uint64)), nil
	case TypeInt64:
		return arrayValueOwned(decodeFixed(d, n, 8, func(b []byte) int64 { return int64(binary.LittleEndian.Uint64(b)) })), nil
	case TypeFloat64:
		return arrayValueOwned(decodeFixed(d, n, 8, func(b []byte) float64 { return math.Float64frombits(binary.LittleEndian.Uint64(b)) })), nil
	case TypeBool:
		raw := d.buf[d.off : d.off+n]
		a := make([]bool, n)
		for i, b := range raw {
			if b > 1 {
				return Value{}, formatErr(ErrInvalid, where.String(), int64(d.off)+int64(i), "bool array element %d is %d, not 0 or 1", i, b)
			}
			a[i] = b == 1
		}
		d.off += n
		return arrayValueOwned(a), nil
	case TypeString:
		a, err := d.stringArray(where, n)
		if err != nil {
			return Value{}, err
		}
		return arrayValueOwned(a), nil
	case TypeArray:
		a := make([]Value, 0, min(n, initialCap))
		for range n {
			v, err := d.array(where, depth+1)
			if err != nil {
				return Value{}, err
			}
			a = append(a, v)
		}
		return arrayValueOwned(a), nil
	}
	return Value{}, formatErr(ErrBadValueType, where.String(), int64(start), "array element type %s cannot be decoded", et)
}

func arrayValueOwned[T any](a []T) Value { return Value{typ: TypeArray, arr: a} }

// decodeFixed decodes n elements of size bytes each; the caller has checked
// that n*size bytes remain.
func decodeFixed[T any](d *decoder, n, size uint64, get func([]byte) T) []T {
	raw := d.buf[d.off : d.off+n*size]
	a := make([]T, n)
	for i := range a {
		a[i] = get(raw[uint64(i)*size:])
	}
	d.off += n * size
	return a
}

// stringArray decodes n length-prefixed strings. Vocabularies hold 10^5 of them,
// so it validates all lengths first and then copies every string into one
// allocation that the results slice into, instead of allocating each.
func (d *decoder) stringArray(where loc, n uint64) ([]string, error) {
	off := d.off
	total := uint64(0)
	for i := range n {
		if uint64(len(d.buf))-off < 8 {
			return nil, formatErr(ErrTruncated, where.String(), int64(off), "length of string element %d needs 8 bytes but only %d remain", i, uint64(len(d.buf))-off)
		}
		l := binary.LittleEndian.Uint64(d.buf[off:])
		off += 8
		if l > uint64(len(d.buf))-off {
			return nil, formatErr(ErrTruncated, where.String(), int64(off-8), "string element %d length %d exceeds the %d bytes remaining", i, l, uint64(len(d.buf))-off)
		}
		off += l
		total += l
	}
	var b strings.Builder
	b.Grow(int(total))
	off = d.off
	for range n {
		l := binary.LittleEndian.Uint64(d.buf[off:])
		b.Write(d.buf[off+8 : off+8+l])
		off += 8 + l
	}
	all := b.String()
	a := make([]string, n)
	off = d.off
	pos := uint64(0)
	for i := range a {
		l := binary.LittleEndian.Uint64(d.buf[off:])
		a[i] = all[pos : pos+l]
		pos += l
		off += 8 + l
	}
	d.off = off
	return a, nil
}

func (f *File) setAlignment() error {
	f.Alignment = DefaultAlignment
	v, ok := f.Get(AlignmentKey)
	if !ok {
		return nil
	}
	where := loc{kind: locKey, name: AlignmentKey}
	a, ok := v.AsUint()
	if !ok {
		return formatErr(ErrBadAlignment, where.String(), -1, "alignment is %s %s, not a non-negative integer", v.typ, v)
	}
	if a == 0 || a&(a-1) != 0 {
		return formatErr(ErrBadAlignment, where.String(), -1, "alignment %d is not a positive power of two", a)
	}
	f.Alignment = a
	return nil
}

func (f *File) parseTensorInfos(d *decoder, n int) error {
	f.Tensors = make([]TensorInfo, 0, min(n, initialCap))
	f.names = make(map[string]int, min(n, initialCap))
	for i := range n {
		where := loc{kind: locTensorInfo, idx: i}
		start := d.off
		name, err := d.str(where, "tensor name", MaxTensorNameLen)
		if err != nil {
			return err
		}
		if name == "" {
			return formatErr(ErrInvalid, where.String(), int64(start), "empty tensor name")
		}
		where = loc{kind: locTensor, name: name}
		if _, dup := f.names[name]; dup {
			return formatErr(ErrDuplicate, where.String(), int64(start), "tensor name occurs more than once")
		}
		nDims, ok := d.u32()
		if !ok {
			return d.truncated(where, "n_dims", 4)
		}
		if nDims > MaxDims {
			return formatErr(ErrBadShape, where.String(), int64(d.off-4), "%d dimensions, more than the limit of %d", nDims, MaxDims)
		}
		dims := make([]uint64, nDims)
		for j := range dims {
			if dims[j], ok = d.u64(); !ok {
				return d.truncated(where, fmt.Sprintf("dimension %d", j), 8)
			}
		}
		typ, ok := d.u32()
		if !ok {
			return d.truncated(where, "type", 4)
		}
		t := quant.Type(typ)
		if !t.Known() {
			return formatErr(ErrBadTensorType, where.String(), int64(d.off-4), "tensor type id %d is not a known ggml type", typ)
		}
		off, ok := d.u64()
		if !ok {
			return d.truncated(where, "offset", 8)
		}
		size, err := tensorSize(t, dims)
		if err != nil {
			return formatErr(ErrBadShape, where.String(), int64(start), "%v", err)
		}
		f.names[name] = len(f.Tensors)
		// Offset holds the relative offset until placeTensors knows where
		// the data section starts.
		f.Tensors = append(f.Tensors, TensorInfo{Name: name, Dims: dims, Type: t, Offset: off, Size: size})
	}
	return nil
}

// tensorSize validates a shape and returns the byte size of a tensor of type
// t with dimensions dims. Like ggml it requires every dimension and the
// element count to fit in an int64, and the row length (dims[0]) to be a
// whole number of t's blocks.
func tensorSize(t quant.Type, dims []uint64) (uint64, error) {
	n := uint64(1)
	for i, dim := range dims {
		if dim > math.MaxInt64 {
			return 0, fmt.Errorf("dimension %d is %d, more than the int64 maximum", i, dim)
		}
		hi, lo := bits.Mul64(n, dim)
		if hi != 0 || lo > math.MaxInt64 {
			return 0, fmt.Errorf("dimensions %v: element count overflows int64", dims)
		}
		n = lo
	}
	ne0 := uint64(1)
	if len(dims) > 0 {
		ne0 = dims[0]
	}
	if bs := uint64(t.BlockSize()); ne0%bs != 0 {
		return 0, fmt.Errorf("row length %d is not a multiple of the %s block size %d", ne0, t, bs)
	}
	size, err := quant.RowBytes(t, n)
	if err != nil {
		return 0, err
	}
	return size, nil
}

// placeTensors aligns the start of the data section after the tensor infos
// (which end at infoEnd), turns relative offsets into absolute ones and
// checks every tensor's alignment, bounds and overlap.
func (f *File) placeTensors(infoEnd uint64) error {
	dataOff, ok := alignUp(infoEnd, f.Alignment)
	if !ok {
		return formatErr(ErrBadAlignment, loc{kind: locKey, name: AlignmentKey}.String(), -1, "aligning the data section start %d to %d overflows", infoEnd, f.Alignment)
	}
	f.DataOffset = dataOff
	for i := range f.Tensors {
		t := &f.Tensors[i]
		where := loc{kind: locTensor, name: t.Name}
		if t.Offset%f.Alignment != 0 {
			return formatErr(ErrMisaligned, where.String(), -1, "data offset %d is not a multiple of the alignment %d", t.Offset, f.Alignment)
		}
		abs, c1 := bits.Add64(dataOff, t.Offset, 0)
		end, c2 := bits.Add64(abs, t.Size, 0)
		if c1 != 0 || c2 != 0 {
			return formatErr(ErrOutOfBounds, where.String(), -1, "data at relative offset %d of %d bytes overflows a 64-bit file offset", t.Offset, t.Size)
		}
		if end > f.size {
			return formatErr(ErrOutOfBounds, where.String(), -1, "data ends at %d past file end %d", end, f.size)
		}
		t.Offset = abs
	}
	// Empty tensors occupy no bytes, so they cannot overlap anything.
	order := make([]int, 0, len(f.Tensors))
	for i := range f.Tensors {
		if f.Tensors[i].Size > 0 {
			order = append(order, i)
		}
	}
	slices.SortFunc(order, func(a, b int) int {
		ta, tb := &f.Tensors[a], &f.Tensors[b]
		if ta.Offset != tb.Offset {
			if ta.Offset < tb.Offset {
				return -1
			}
			return 1
		}
		return a - b
	})
	for k := 1; k < len(order); k++ {
		prev, cur := &f.Tensors[order[k-1]], &f.Tensors[order[k]]
		if cur.Offset < prev.Offset+prev.Size {
			return formatErr(ErrOverlap, loc{kind: locTensor, name: cur.Name}.String(), -1,
				"data [%d, %d) overlaps tensor %q at [%d, %d)", cur.Offset, cur.Offset+cur.Size, prev.Name, prev.Offset, prev.Offset+prev.Size)
		}
	}
	return nil
}

// alignUp rounds x up to a multiple of align (a power of two), reporting
// false on overflow.
func alignUp(x, align uint64) (uint64, bool) {
	y, carry := bits.Add64(x, align-1, 0)
	if carry != 0 {
		return 0, false
	}
	return y &^ (align - 1), true
}
