package gguf

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// ValueType is a GGUF metadata value type id, as stored in the file.
type ValueType uint32

// The GGUF metadata value type ids. The numbering is part of the format.
const (
	TypeUint8   ValueType = 0
	TypeInt8    ValueType = 1
	TypeUint16  ValueType = 2
	TypeInt16   ValueType = 3
	TypeUint32  ValueType = 4
	TypeInt32   ValueType = 5
	TypeFloat32 ValueType = 6
	TypeBool    ValueType = 7
	TypeString  ValueType = 8
	TypeArray   ValueType = 9
	TypeUint64  ValueType = 10
	TypeInt64   ValueType = 11
	TypeFloat64 ValueType = 12
)

var valueTypeNames = [...]string{
	TypeUint8:   "uint8",
	TypeInt8:    "int8",
	TypeUint16:  "uint16",
	TypeInt16:   "int16",
	TypeUint32:  "uint32",
	TypeInt32:   "int32",
	TypeFloat32: "float32",
	TypeBool:    "bool",
	TypeString:  "string",
	TypeArray:   "array",
	TypeUint64:  "uint64",
	TypeInt64:   "int64",
	TypeFloat64: "float64",
}

// Valid reports whether t is a type id GGUF defines.
func (t ValueType) Valid() bool { return t <= TypeFloat64 }

func (t ValueType) String() string {
	if t.Valid() {
		return valueTypeNames[t]
	}
	return "ValueType(" + strconv.FormatUint(uint64(t), 10) + ")"
}

// minEncodedSize is the fewest bytes one value of type t occupies in a file:
// its exact size for fixed-size types, the length prefix for a string, and
// element type plus count for an array. Counts read from a file are bounded
// by remaining/minEncodedSize, which keeps every allocation proportional to
// the file's size whatever its header claims.
func (t ValueType) minEncodedSize() uint64 {
	switch t {
	case TypeUint8, TypeInt8, TypeBool:
		return 1
	case TypeUint16, TypeInt16:
		return 2
	case TypeUint32, TypeInt32, TypeFloat32:
		return 4
	case TypeUint64, TypeInt64, TypeFloat64, TypeString:
		return 8
	case TypeArray:
		return 12
	}
	return 0
}

// MaxArrayDepth bounds how deeply arrays may nest (an array of scalars has
// depth 1). GGUF sets no limit; this one keeps a hostile file from driving
// the decoder's recursion arbitrarily deep.
const MaxArrayDepth = 32

// Value is one decoded metadata value: a type tag and the data. Scalars are
// held unboxed; arrays are held as typed Go slices ([]float32, []string, …,
// and []Value for arrays of arrays), so a 150k-entry vocabulary costs one
// slice, not 150k interfaces.
//
// Slices returned by a Value's accessors share its storage: callers must
// not modify them. The zero Value is the uint8 0.
type Value struct {
	typ ValueType
	num uint64 // integer bits (signed types sign-extended), float bits, or bool 0/1
	str string
	arr any // for TypeArray: one of the slice types listed in ElemType
}

// Type returns the value's type tag.
func (v Value) Type() ValueType { return v.typ }

// ElemType returns the element type of an array value, and false if v is
// not an array.
func (v Value) ElemType() (ValueType, bool) {
	if v.typ != TypeArray {
		return 0, false
	}
	switch v.arr.(type) {
	case []uint8:
		return TypeUint8, true
	case []int8:
		return TypeInt8, true
	case []uint16:
		return TypeUint16, true
	case []int16:
		return TypeInt16, true
	case []uint32:
		return TypeUint32, true
	case []int32:
		return TypeInt32, true
	case []float32:
		return TypeFloat32, true
	case []bool:
		return TypeBool, true
	case []string:
		return TypeString, true
	case []Value:
		return TypeArray, true
	case []uint64:
		return TypeUint64, true
	case []int64:
		return TypeInt64, true
	case []float64:
		return TypeFloat64, true
	}
	return 0, false
}

// Len returns the number of elements of an array value, and 0 otherwise.
func (v Value) Len() int {
	switch a := v.arr.(type) {
	case []uint8:
		return len(a)
	case []int8:
		return len(a)
	case []uint16:
		return len(a)
	case []int16:
		return len(a)
	case []uint32:
		return len(a)
	case []int32:
		return len(a)
	case []float32:
		return len(a)
	case []bool:
		return len(a)
	case []string:
		return len(a)
	case []Value:
		return len(a)
	case []uint64:
		return len(a)
	case []int64:
		return len(a)
	case []float64:
		return len(a)
	}
	return 0
}

func isUnsigned(t ValueType) bool {
	return t == TypeUint8 || t == TypeUint16 || t == TypeUint32 || t == TypeUint64
}

func isSigned(t ValueType) bool {
	return t == TypeInt8 || t == TypeInt16 || t == TypeInt32 || t == TypeInt64
}

// AsUint returns an integer value of any width and signedness as a uint64;
// it fails for negative values and non-integers.
func (v Value) AsUint() (uint64, bool) {
	switch {
	case isUnsigned(v.typ):
		return v.num, true
	case isSigned(v.typ) && int64(v.num) >= 0:
		return v.num, true
	}
	return 0, false
}

// AsInt returns an integer value of any width and signedness as an int64;
// it fails for uint64 values above math.MaxInt64 and non-integers.
func (v Value) AsInt() (int64, bool) {
	switch {
	case isSigned(v.typ):
		return int64(v.num), true
	case isUnsigned(v.typ) && v.num <= math.MaxInt64:
		return int64(v.num), true
	}
	return 0, false
}

// AsFloat returns a float32, float64 or integer value as a float64 (large
// 64-bit integers round to the nearest float64).
func (v Value) AsFloat() (float64, bool) {
	switch {
	case v.typ == TypeFloat32:
		return float64(math.Float32frombits(uint32(v.num))), true
	case v.typ == TypeFloat64:
		return math.Float64frombits(v.num), true
	case isUnsigned(v.typ):
		return float64(v.num), true
	case isSigned(v.typ):
		return float64(int64(v.num)), true
	}
	return 0, false
}

// AsBool returns a bool value.
func (v Value) AsBool() (bool, bool) {
	if v.typ != TypeBool {
		return false, false
	}
	return v.num != 0, true
}

// AsString returns a string value. (String, by contrast, formats any value
// for people to read.)
func (v Value) AsString() (string, bool) {
	if v.typ != TypeString {
		return "", false
	}
	return v.str, true
}

// arrayOf returns v's elements if v is an array of exactly element type T.
func arrayOf[T any](v Value) ([]T, bool) {
	if v.typ != TypeArray {
		return nil, false
	}
	a, ok := v.arr.([]T)
	return a, ok
}

// The typed array accessors return the elements of an array whose element
// type is exactly the one named, without copying or converting. The File
// getters (Int32s, Float32s) convert between widths where that is lossless.

func (v Value) Uint8s() ([]uint8, bool)     { return arrayOf[uint8](v) }
func (v Value) Int8s() ([]int8, bool)       { return arrayOf[int8](v) }
func (v Value) Uint16s() ([]uint16, bool)   { return arrayOf[uint16](v) }
func (v Value) Int16s() ([]int16, bool)     { return arrayOf[int16](v) }
func (v Value) Uint32s() ([]uint32, bool)   { return arrayOf[uint32](v) }
func (v Value) Int32s() ([]int32, bool)     { return arrayOf[int32](v) }
func (v Value) Float32s() ([]float32, bool) { return arrayOf[float32](v) }
func (v Value) Bools() ([]bool, bool)       { return arrayOf[bool](v) }
func (v Value) Strings() ([]string, bool)   { return arrayOf[string](v) }
func (v Value) Uint64s() ([]uint64, bool)   { return arrayOf[uint64](v) }
func (v Value) Int64s() ([]int64, bool)     { return arrayOf[int64](v) }
func (v Value) Float64s() ([]float64, bool) { return arrayOf[float64](v) }

// Array returns the elements of an array of arrays; each element is itself
// an array Value.
func (v Value) Array() ([]Value, bool) { return arrayOf[Value](v) }

// Any returns the value as the Go type that holds it exactly: uint8 … float64,
// bool or string for scalars, and the typed slice for arrays.
func (v Value) Any() any {
	switch v.typ {
	case TypeUint8:
		return uint8(v.num)
	case TypeInt8:
		return int8(v.num)
	case TypeUint16:
		return uint16(v.num)
	case TypeInt16:
		return int16(v.num)
	case TypeUint32:
		return uint32(v.num)
	case TypeInt32:
		return int32(v.num)
	case TypeFloat32:
		return math.Float32frombits(uint32(v.num))
	case TypeBool:
		return v.num != 0
	case TypeString:
		return v.str
	case TypeArray:
		return v.arr
	case TypeUint64:
		return v.num
	case TypeInt64:
		return int64(v.num)
	case TypeFloat64:
		return math.Float64frombits(v.num)
	}
	return nil
}

// Equal reports whether v and o have the same type and the same data. Floats
// compare by bit pattern, so a NaN equals itself: Equal answers "would these
// encode to the same bytes", which is what round-trip checks need.
func (v Value) Equal(o Value) bool {
	if v.typ != o.typ || v.num != o.num || v.str != o.str {
		return false
	}
	if v.typ != TypeArray {
		return true
	}
	switch a := v.arr.(type) {
	case []uint8:
		return sliceEqual(a, o.arr, func(x, y uint8) bool { return x == y })
	case []int8:
		return sliceEqual(a, o.arr, func(x, y int8) bool { return x == y })
	case []uint16:
		return sliceEqual(a, o.arr, func(x, y uint16) bool { return x == y })
	case []int16:
		return sliceEqual(a, o.arr, func(x, y int16) bool { return x == y })
	case []uint32:
		return sliceEqual(a, o.arr, func(x, y uint32) bool { return x == y })
	case []int32:
		return sliceEqual(a, o.arr, func(x, y int32) bool { return x == y })
	case []float32:
		return sliceEqual(a, o.arr, func(x, y float32) bool { return math.Float32bits(x) == math.Float32bits(y) })
	case []bool:
		return sliceEqual(a, o.arr, func(x, y bool) bool { return x == y })
	case []string:
		return sliceEqual(a, o.arr, func(x, y string) bool { return x == y })
	case []Value:
		return sliceEqual(a, o.arr, Value.Equal)
	case []uint64:
		return sliceEqual(a, o.arr, func(x, y uint64) bool { return x == y })
	case []int64:
		return sliceEqual(a, o.arr, func(x, y int64) bool { return x == y })
	case []float64:
		return sliceEqual(a, o.arr, func(x, y float64) bool { return math.Float64bits(x) == math.Float64bits(y) })
	}
	return false
}

func sliceEqual[T any](a []T, other any, eq func(T, T) bool) bool {
	b, ok := other.([]T)
	if !ok || len(a) != len(b) {
		return false
	}
	for i := range a {
		if !eq(a[i], b[i]) {
			return false
		}
	}
	return true
}

// String formats the value for people: strings quoted, arrays as their type
// and length followed by at most a few leading elements.
func (v Value) String() string {
	switch v.typ {
	case TypeString:
		return strconv.Quote(v.str)
	case TypeArray:
		return formatArray(v)
	}
	if !v.typ.Valid() {
		return v.typ.String()
	}
	return fmt.Sprint(v.Any())
}

const arrayPreview = 8

func formatArray(v Value) string {
	et, _ := v.ElemType()
	n := v.Len()
	var b strings.Builder
	fmt.Fprintf(&b, "[%d]%s{", n, et)
	for i := range min(n, arrayPreview) {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(elemString(v, i))
	}
	if n > arrayPreview {
		b.WriteString(", …")
	}
	b.WriteString("}")
	return b.String()
}

func elemString(v Value, i int) string {
	switch a := v.arr.(type) {
	case []string:
		return strconv.Quote(a[i])
	case []Value:
		return a[i].String()
	case []uint8:
		return fmt.Sprint(a[i])
	case []int8:
		return fmt.Sprint(a[i])
	case []uint16:
		return fmt.Sprint(a[i])
	case []int16:
		return fmt.Sprint(a[i])
	case []uint32:
		return fmt.Sprint(a[i])
	case []int32:
		return fmt.Sprint(a[i])
	case []float32:
		return fmt.Sprint(a[i])
	case []bool:
		return fmt.Sprint(a[i])
	case []uint64:
		return fmt.Sprint(a[i])
	case []int64:
		return fmt.Sprint(a[i])
	case []float64:
		return fmt.Sprint(a[i])
	}
	return "?"
}

// NewValue converts a Go value to a Value: string, bool, every sized integer
// and float type, int (stored as int64) and uint (as uint64); slices of all of
// those (as arrays; the slice is copied); []Value whose elements are all
// arrays (an array of arrays); or a Value, returned as is.
func NewValue(x any) (Value, error) {
	switch x := x.(type) {
	case Value:
		return x, nil
	case string:
		return Value{typ: TypeString, str: x}, nil
	case bool:
		var n uint64
		if x {
			n = 1
		}
		return Value{typ: TypeBool, num: n}, nil
	case uint8:
		return Value{typ: TypeUint8, num: uint64(x)}, nil
	case int8:
		return Value{typ: TypeInt8, num: uint64(int64(x))}, nil
	case uint16:
		return Value{typ: TypeUint16, num: uint64(x)}, nil
	case int16:
		return Value{typ: TypeInt16, num: uint64(int64(x))}, nil
	case uint32:
		return Value{typ: TypeUint32, num: uint64(x)}, nil
	case int32:
		return Value{typ: TypeInt32, num: uint64(int64(x))}, nil
	case uint64:
		return Value{typ: TypeUint64, num: x}, nil
	case int64:
		return Value{typ: TypeInt64, num: uint64(x)}, nil
	case uint:
		return Value{typ: TypeUint64, num: uint64(x)}, nil
	case int:
		return Value{typ: TypeInt64, num: uint64(int64(x))}, nil
	case float32:
		return Value{typ: TypeFloat32, num: uint64(math.Float32bits(x))}, nil
	case float64:
		return Value{typ: TypeFloat64, num: math.Float64bits(x)}, nil
	case []string:
		return arrayValue(x), nil
	case []bool:
		return arrayValue(x), nil
	case []uint8:
		return arrayValue(x), nil
	case []int8:
		return arrayValue(x), nil
	case []uint16:
		return arrayValue(x), nil
	case []int16:
		return arrayValue(x), nil
	case []uint32:
		return arrayValue(x), nil
	case []int32:
		return arrayValue(x), nil
	case []uint64:
		return arrayValue(x), nil
	case []int64:
		return arrayValue(x), nil
	case []float32:
		return arrayValue(x), nil
	case []float64:
		return arrayValue(x), nil
	case []uint:
		a := make([]uint64, len(x))
		for i, e := range x {
			a[i] = uint64(e)
		}
		return Value{typ: TypeArray, arr: a}, nil
	case []int:
		a := make([]int64, len(x))
		for i, e := range x {
			a[i] = int64(e)
		}
		return Value{typ: TypeArray, arr: a}, nil
	case []Value:
		for i, e := range x {
			if e.typ != TypeArray {
				return Value{}, fmt.Errorf("gguf: []Value element %d is a %s; a []Value must hold arrays only (use a typed slice for an array of scalars)", i, e.typ)
			}
		}
		v := arrayValue(x)
		if d := v.depth(); d > MaxArrayDepth {
			return Value{}, fmt.Errorf("gguf: arrays nest %d deep, more than %d", d, MaxArrayDepth)
		}
		return v, nil
	case nil:
		return Value{}, fmt.Errorf("gguf: cannot store a nil value")
	}
	return Value{}, fmt.Errorf("gguf: cannot store a value of Go type %T", x)
}

func arrayValue[T any](x []T) Value {
	// A non-nil empty slice keeps Equal and Any uniform whatever the caller
	// passed; the element type is carried by T either way.
	a := make([]T, len(x))
	copy(a, x)
	return Value{typ: TypeArray, arr: a}
}

// depth is how deeply arrays nest in v: 0 for a scalar, 1 for an array of
// scalars.
func (v Value) depth() int {
	if v.typ != TypeArray {
		return 0
	}
	d := 0
	if a, ok := v.arr.([]Value); ok {
		for _, e := range a {
			d = max(d, e.depth())
		}
	}
	return d + 1
}
