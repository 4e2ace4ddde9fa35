package gguf

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/baton-serving/baton/kernels/quant"
)

// validFile is a small well-formed file: one KV, two F32 tensors of 8 bytes
// at relative offsets 0 and 32.
func validFile() *raw {
	r := header(3, 2, 1).kvU32("general.alignment", 32)
	r.tensor("a", quant.F32, 0, 2).tensor("b", quant.F32, 32, 2)
	return r.data(32, 40)
}

func TestParseValid(t *testing.T) {
	for _, version := range []uint32{2, 3} {
		r := header(version, 1, 1).kvU32("k", 5).tensor("a", quant.F32, 0, 2, 1).data(32, 8)
		f, err := Parse(r.b)
		if err != nil {
			t.Fatalf("version %d: %v", version, err)
		}
		if f.Version != version || f.DataOffset%32 != 0 || len(f.Tensors) != 1 || f.Tensors[0].Offset != f.DataOffset {
			t.Errorf("version %d: parsed %+v", version, f)
		}
		if f.Size() != uint64(len(r.b)) {
			t.Errorf("Size() = %d, want %d", f.Size(), len(r.b))
		}
	}
	if _, err := Parse(validFile().b); err != nil {
		t.Fatal(err)
	}
}

func TestParseCorrupt(t *testing.T) {
	huge := uint64(1) << 62
	cases := []struct {
		name   string
		data   []byte
		want   error
		detail string // a substring the message must contain
	}{
		{"empty", nil, ErrTruncated, "magic"},
		{"short magic", []byte("GG"), ErrTruncated, "magic"},
		{"bad magic", []byte("GGML\x03\x00\x00\x00"), ErrBadMagic, `"GGML"`},
		{"no version", []byte("GGUF\x03"), ErrTruncated, "version"},
		{"v1", header(1, 0, 0).b, ErrUnsupportedVersion, "version 1"},
		{"v4", header(4, 0, 0).b, ErrUnsupportedVersion, "version 4"},
		{"big endian", []byte("GGUF\x00\x00\x00\x03"), ErrUnsupportedVersion, "big-endian"},
		{"no counts", []byte("GGUF\x03\x00\x00\x00\x01"), ErrTruncated, "tensor count"},
		{"2^40 tensors", header(3, 1<<40, 0).b, ErrTruncated, "1099511627776 tensors"},
		{"2^64-1 tensors", header(3, math.MaxUint64, 0).b, ErrTruncated, "tensors"},
		{"2^40 kvs", header(3, 0, 1<<40).b, ErrTruncated, "metadata entries"},
		{"counts together too big", append(header(3, 1, 1).b, make([]byte, 30)...), ErrTruncated, "after the metadata"},
		{"key 2^62 long", header(3, 0, 1).u64(huge).u32(0).u8(0).b, ErrTruncated, "key length 4611686018427387904"},
		{"empty key", header(3, 0, 1).str("").u32(0).u8(0).b, ErrInvalid, "empty key"},
		{"dup key", header(3, 0, 2).kvU32("k", 1).kvU32("k", 2).b, ErrDuplicate, `key "k"`},
		{"bad value type", header(3, 0, 1).str("k").u32(13).u8(0).b, ErrBadValueType, "13"},
		{"truncated u32", header(3, 0, 1).str("k").u32(uint32(TypeUint32)).u8(0).u8(0).b, ErrTruncated, "uint32 value"},
		{"bool 2", header(3, 0, 1).str("k").u32(uint32(TypeBool)).u8(2).b, ErrInvalid, "bool"},
		{"string 2^62 long", header(3, 0, 1).str("k").u32(uint32(TypeString)).u64(huge).b, ErrTruncated, "string value length"},
		{"array bad elem", header(3, 0, 1).str("k").u32(uint32(TypeArray)).u32(99).u64(0).b, ErrBadValueType, "99"},
		{"array 2^62 u64", header(3, 0, 1).str("k").u32(uint32(TypeArray)).u32(uint32(TypeUint64)).u64(huge).b, ErrTruncated, "array of"},
		{"array 2^40 strings", header(3, 0, 1).str("k").u32(uint32(TypeArray)).u32(uint32(TypeString)).u64(1 << 40).u64(0).b, ErrTruncated, "1099511627776 string"},
		{"array string element too long", header(3, 0, 1).str("k").u32(uint32(TypeArray)).u32(uint32(TypeString)).u64(2).str("ok").u64(huge).b, ErrTruncated, "string element 1"},
		{"array bool 3", header(3, 0, 1).str("k").u32(uint32(TypeArray)).u32(uint32(TypeBool)).u64(2).u8(1).u8(3).b, ErrInvalid, "element 1"},
		{"nested array truncated", header(3, 0, 1).str("k").u32(uint32(TypeArray)).u32(uint32(TypeArray)).u64(1).u32(uint32(TypeUint8)).u64(5).u8(1).b, ErrTruncated, `key "k"`},
		{"alignment 0", header(3, 0, 1).kvU32(AlignmentKey, 0).b, ErrBadAlignment, "alignment 0"},
		{"alignment 48", header(3, 0, 1).kvU32(AlignmentKey, 48).b, ErrBadAlignment, "alignment 48"},
		{"alignment string", header(3, 0, 1).str(AlignmentKey).u32(uint32(TypeString)).str("32").b, ErrBadAlignment, "not a non-negative integer"},
		{"alignment negative", header(3, 0, 1).str(AlignmentKey).u32(uint32(TypeInt32)).u32(math.MaxUint32).b, ErrBadAlignment, "not a non-negative integer"},
		{"alignment 2^63 puts data past end", header(3, 1, 1).str(AlignmentKey).u32(uint32(TypeUint64)).u64(1<<63).tensor("a", quant.F32, 0, 1).data(32, 4).b, ErrOutOfBounds, "data ends at 9223372036854775812"},
		{"tensor name 2^62 long", header(3, 1, 0).u64(huge).u32(0).u32(0).u64(0).b, ErrTruncated, "tensor name length"},
		{"empty tensor name", header(3, 1, 0).tensor("", quant.F32, 0, 1).data(32, 4).b, ErrInvalid, "empty tensor name"},
		{"tensor name too long", header(3, 1, 0).tensor(strings.Repeat("x", 65), quant.F32, 0, 1).data(32, 4).b, ErrInvalid, "65 bytes"},
		{"dup tensor", header(3, 2, 0).tensor("a", quant.F32, 0, 1).tensor("a", quant.F32, 32, 1).data(32, 36).b, ErrDuplicate, `tensor "a"`},
		{"9 dims", header(3, 1, 0).tensor("a", quant.F32, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1).data(32, 4).b, ErrBadShape, "9 dimensions"},
		{"n_dims 2^31", header(3, 1, 0).str("a").u32(1 << 31).u32(0).u64(0).b, ErrBadShape, "2147483648 dimensions"},
		{"dims truncated", header(3, 1, 0).str("a").u32(4).u64(1).u64(1).b, ErrTruncated, "dimension 2"},
		{"dim above int64", header(3, 1, 0).tensor("a", quant.F32, 0, 1<<63).b, ErrBadShape, "int64"},
		{"dims overflow", header(3, 1, 0).tensor("a", quant.F32, 0, 1<<32, 1<<32).b, ErrBadShape, "overflows"},
		{"size overflow", header(3, 1, 0).tensor("a", quant.F32, 0, 1<<62).b, ErrBadShape, "overflow"},
		{"unknown type", header(3, 1, 0).tensor("a", quant.Type(4), 0, 1).data(32, 4).b, ErrBadTensorType, "type id 4"},
		{"unknown type 2^31", header(3, 1, 0).tensor("a", quant.Type(1<<31), 0, 1).data(32, 4).b, ErrBadTensorType, "2147483648"},
		{"partial block", header(3, 1, 0).tensor("a", quant.Q4_K, 0, 128, 2).data(32, 144).b, ErrBadShape, "block size 256"},
		{"misaligned", header(3, 1, 0).tensor("a", quant.F32, 4, 1).data(32, 8).b, ErrMisaligned, "offset 4"},
		{"misaligned for 64", header(3, 1, 1).kvU32(AlignmentKey, 64).tensor("a", quant.F32, 32, 1).data(64, 64).b, ErrMisaligned, "alignment 64"},
		{"out of bounds", header(3, 1, 0).tensor("blk.3.attn_q.weight", quant.F32, 0, 64, 64).data(32, 100).b, ErrOutOfBounds, `tensor "blk.3.attn_q.weight": data ends at`},
		{"offset past end", header(3, 1, 0).tensor("a", quant.F32, 1<<40, 1).data(32, 4).b, ErrOutOfBounds, "past file end"},
		{"offset overflows", header(3, 1, 0).tensor("a", quant.F32, math.MaxUint64-31, 1).data(32, 4).b, ErrOutOfBounds, "overflows"},
		{"no data section", header(3, 1, 0).tensor("a", quant.F32, 0, 1).b, ErrOutOfBounds, "past file end"},
		{"overlap", header(3, 2, 0).tensor("a", quant.F32, 0, 16).tensor("b", quant.F32, 32, 1).data(32, 64).b, ErrOverlap, `overlaps tensor "a"`},
		{"same offset", header(3, 2, 0).tensor("a", quant.F32, 0, 1).tensor("b", quant.F32, 0, 1).data(32, 4).b, ErrOverlap, "overlaps"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f, err := Parse(c.data)
			if err == nil {
				t.Fatalf("Parse succeeded: %+v", f)
			}
			if !errors.Is(err, c.want) {
				t.Errorf("error %q is not %v", err, c.want)
			}
			var fe *FormatError
			if !errors.As(err, &fe) {
				t.Errorf("error %q is not a *FormatError", err)
			}
			if !strings.HasPrefix(err.Error(), "gguf: ") || !strings.Contains(err.Error(), c.detail) {
				t.Errorf("error %q does not mention %q", err, c.detail)
			}
		})
	}
}

func TestZeroSizeTensorsDoNotOverlap(t *testing.T) {
	r := header(3, 3, 0).tensor("a", quant.F32, 0, 16).tensor("e", quant.F32, 32, 0).tensor("z", quant.F32, 64, 4, 0)
	f, err := Parse(r.data(32, 64).b)
	if err != nil {
		t.Fatal(err)
	}
	if e, _ := f.Tensor("e"); e.Size != 0 || e.NumElements() != 0 || len(f.TensorData(e)) != 0 {
		t.Errorf("empty tensor: %+v", e)
	}
}

func TestTruncatedEverywhere(t *testing.T) {
	data := writeBytes(t, sampleWriter(t))
	full, err := Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	// Cutting anywhere before the end of the last tensor's data must fail;
	// cutting only trailing padding must not.
	var dataEnd uint64
	for _, ti := range full.Tensors {
		dataEnd = max(dataEnd, ti.Offset+ti.Size)
	}
	for n := range len(data) {
		_, err := Parse(data[:n])
		if uint64(n) >= dataEnd {
			if err != nil {
				t.Errorf("cut at %d (data ends at %d): %v", n, dataEnd, err)
			}
			continue
		}
		var fe *FormatError
		if !errors.As(err, &fe) {
			t.Fatalf("cut at %d of %d: error %v is not a *FormatError", n, len(data), err)
		}
		if uint64(n) < full.DataOffset-32 && !errors.Is(err, ErrTruncated) {
			t.Errorf("cut at %d inside the metadata: %v is not ErrTruncated", n, err)
		}
	}
}

// allocated returns the bytes allocated while fn runs.
func allocated(fn func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

func TestHostileCountsFailFastInSmallMemory(t *testing.T) {
	huge := uint64(1) << 62
	pad := make([]byte, 64) // so that the header's own bounds do not catch these first
	// 2^17 strings whose last one claims 2^62 bytes: the lengths are all
	// checked before anything is allocated.
	lastLies := header(3, 0, 1).str("k").u32(uint32(TypeArray)).u32(uint32(TypeString)).u64(1 << 17)
	lastLies.b = append(lastLies.b, make([]byte, 8*(1<<17-1))...)
	lastLies.u64(huge)
	cases := []struct {
		name   string
		data   []byte
		detail string
	}{
		{"2^40 tensors", header(3, 1<<40, 0).b, "1099511627776 tensors"},
		{"2^40 tensors and kvs", header(3, 1<<40, 1<<40).b, "1099511627776 metadata entries"},
		{"2^62 key length", append(header(3, 0, 1).u64(huge).b, pad...), "key length"},
		{"2^62 string value", append(header(3, 0, 1).str("k").u32(uint32(TypeString)).u64(huge).b, pad...), "string value length"},
		{"2^62 float32 array", append(header(3, 0, 1).str("k").u32(uint32(TypeArray)).u32(uint32(TypeFloat32)).u64(huge).b, pad...), "4611686018427387904 float32"},
		{"2^60 string array", append(header(3, 0, 1).str("k").u32(uint32(TypeArray)).u32(uint32(TypeString)).u64(1<<60).b, pad...), "1152921504606846976 string"},
		{"2^60 nested arrays", append(header(3, 0, 1).str("k").u32(uint32(TypeArray)).u32(uint32(TypeArray)).u64(1<<60).b, pad...), "1152921504606846976 array"},
		{"2^62 tensor name", append(header(3, 1, 0).u64(huge).b, pad...), "tensor name length"},
		{"tensor of 2^62 floats", append(header(3, 1, 0).tensor("a", quant.F32, 0, 1<<31, 1<<31).b, pad...), "overflow"},
		{"2^31 dims", append(header(3, 1, 0).str("a").u32(1<<31).b, pad...), "2147483648 dimensions"},
		{"last of 2^17 strings lies", lastLies.b, "string element 131071 length"},
	}
	for _, c := range cases {
		var err error
		n := allocated(func() { _, err = Parse(c.data) })
		if err == nil || !strings.Contains(err.Error(), c.detail) {
			t.Errorf("%s: error %v does not mention %q", c.name, err, c.detail)
		}
		if n > 64<<10 {
			t.Errorf("%s: Parse allocated %d bytes", c.name, n)
		}
	}
}

func TestParseMemoryProportionalToFile(t *testing.T) {
	// The inputs that make Parse allocate most per byte: empty strings (8
	// bytes each), empty nested arrays (12 bytes each) and tiny metadata
	// entries (16 bytes each).
	const n = 1 << 14
	strs := header(3, 0, 1).str("k").u32(uint32(TypeArray)).u32(uint32(TypeString)).u64(n)
	strs.b = append(strs.b, make([]byte, 8*n)...)
	nested := header(3, 0, 1).str("k").u32(uint32(TypeArray)).u32(uint32(TypeArray)).u64(n)
	for range n {
		nested.u32(uint32(TypeUint8)).u64(0)
	}
	kvs := header(3, 0, n)
	for i := range n {
		kvs.str(string([]byte{byte(i >> 8), byte(i), 'k'})).u32(uint32(TypeUint8)).u8(1)
	}
	for name, data := range map[string][]byte{"strings": strs.b, "nested": nested.b, "kvs": kvs.b} {
		var err error
		got := allocated(func() { _, err = Parse(data) })
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if limit := 16 * uint64(len(data)); got > limit {
			t.Errorf("%s: Parse of %d bytes allocated %d (limit %d)", name, len(data), got, limit)
		}
		t.Logf("%s: %d bytes file, %d bytes allocated", name, len(data), got)
	}
	// A count that fits the file but lies costs a bounded head start only:
	// 1 MB of zeros read as 80000 metadata entries fails at the first,
	// whose key is empty.
	liar := append(header(3, 0, 80000).b, make([]byte, 1<<20)...)
	var err error
	got := allocated(func() { _, err = Parse(liar) })
	if !errors.Is(err, ErrInvalid) {
		t.Errorf("liar: %v", err)
	}
	if got > 4<<20 {
		t.Errorf("liar: Parse allocated %d bytes before failing", got)
	}
	t.Logf("liar: %d bytes allocated", got)
}

func TestDeepNestingRejected(t *testing.T) {
	r := header(3, 0, 1).str("k").u32(uint32(TypeArray))
	for range MaxArrayDepth {
		r.u32(uint32(TypeArray)).u64(1)
	}
	r.u32(uint32(TypeUint8)).u64(0)
	_, err := Parse(r.b)
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "nest") {
		t.Errorf("arrays nested %d deep: %v", MaxArrayDepth+1, err)
	}
}

func TestGetters(t *testing.T) {
	w := sampleWriter(t)
	for _, kv := range []struct {
		k string
		v any
	}{
		{"i32.pos", int32(5)},
		{"arr.u32.big", []uint32{1, math.MaxUint32}},
		{"arr.i64.small", []int64{-5, 1 << 20}},
		{"arr.i64.big", []int64{1 << 40}},
		{"arr.u64.small", []uint64{7}},
	} {
		if err := w.AddKV(kv.k, kv.v); err != nil {
			t.Fatal(err)
		}
	}
	f, err := Parse(writeBytes(t, w))
	if err != nil {
		t.Fatal(err)
	}
	uintCases := []struct {
		key  string
		want uint64
		ok   bool
	}{
		{"u8", 200, true}, {"u16", 60000, true}, {"u32", 4000000000, true}, {"u64", math.MaxUint64, true},
		{"i32.pos", 5, true}, {"int", 7, true}, {"i8", 0, false}, {"i64", 0, false},
		{"f32", 0, false}, {"bool.t", 0, false}, {"general.architecture", 0, false}, {"missing", 0, false},
	}
	for _, c := range uintCases {
		if got, ok := f.Uint(c.key); got != c.want || ok != c.ok {
			t.Errorf("Uint(%q) = %d, %v; want %d, %v", c.key, got, ok, c.want, c.ok)
		}
	}
	intCases := []struct {
		key  string
		want int64
		ok   bool
	}{
		{"i8", -100, true}, {"i16", -30000, true}, {"i32", -2000000000, true}, {"i64", math.MinInt64, true},
		{"u32", 4000000000, true}, {"u64", 0, false}, {"f64", 0, false}, {"missing", 0, false},
	}
	for _, c := range intCases {
		if got, ok := f.Int(c.key); got != c.want || ok != c.ok {
			t.Errorf("Int(%q) = %d, %v; want %d, %v", c.key, got, ok, c.want, c.ok)
		}
	}
	floatCases := []struct {
		key  string
		want float64
		ok   bool
	}{
		{"f32", float64(float32(1e-5)), true}, {"f64", math.Pi, true}, {"i16", -30000, true},
		{"u8", 200, true}, {"bool.t", 0, false}, {"str.utf8", 0, false}, {"missing", 0, false},
	}
	for _, c := range floatCases {
		if got, ok := f.Float(c.key); got != c.want || ok != c.ok {
			t.Errorf("Float(%q) = %g, %v; want %g, %v", c.key, got, ok, c.want, c.ok)
		}
	}
	if got, ok := f.Float("nan"); !ok || !math.IsNaN(got) {
		t.Errorf("Float(nan) = %g, %v", got, ok)
	}
	if b, ok := f.Bool("bool.t"); !b || !ok {
		t.Errorf("Bool(bool.t) = %v, %v", b, ok)
	}
	if b, ok := f.Bool("bool.f"); b || !ok {
		t.Errorf("Bool(bool.f) = %v, %v", b, ok)
	}
	if _, ok := f.Bool("u8"); ok {
		t.Error("Bool(u8) succeeded")
	}
	if s, ok := f.String("str.utf8"); s != "▁héllo" || !ok {
		t.Errorf("String = %q, %v", s, ok)
	}
	if _, ok := f.String("u8"); ok {
		t.Error("String(u8) succeeded")
	}
	if s, ok := f.Strings("arr.str"); !ok || strings.Join(s, ",") != "<unk>,<s>,</s>," {
		t.Errorf("Strings = %q, %v", s, ok)
	}
	if _, ok := f.Strings("arr.f32"); ok {
		t.Error("Strings(arr.f32) succeeded")
	}
	if a, ok := f.Float32s("arr.f32"); !ok || len(a) != 3 || a[0] != 0.5 {
		t.Errorf("Float32s = %v, %v", a, ok)
	}
	if a, ok := f.Float32s("arr.f64"); !ok || len(a) != 1 || a[0] != 1.5 {
		t.Errorf("Float32s(f64) = %v, %v", a, ok)
	}
	if _, ok := f.Float32s("arr.i32"); ok {
		t.Error("Float32s(arr.i32) succeeded")
	}
	int32Cases := []struct {
		key  string
		want []int32
	}{
		{"arr.i32", []int32{-1, 2, 3}},
		{"arr.u8", []int32{0, 1, 255}},
		{"arr.i8", []int32{-128, 0, 127}},
		{"arr.u16", []int32{1, 65535}},
		{"arr.i16", []int32{-32768, 32767}},
		{"arr.i64.small", []int32{-5, 1 << 20}},
		{"arr.u64.small", []int32{7}},
		{"arr.u32.big", nil},
		{"arr.i64.big", nil},
		{"arr.f32", nil},
		{"u32", nil},
		{"missing", nil},
	}
	for _, c := range int32Cases {
		got, ok := f.Int32s(c.key)
		if ok != (c.want != nil) || len(got) != len(c.want) {
			t.Errorf("Int32s(%q) = %v, %v; want %v", c.key, got, ok, c.want)
			continue
		}
		for i := range got {
			if got[i] != c.want[i] {
				t.Errorf("Int32s(%q) = %v, want %v", c.key, got, c.want)
				break
			}
		}
	}
	v, ok := f.Get("arr.nested")
	if !ok {
		t.Fatal("Get(arr.nested) failed")
	}
	if et, _ := v.ElemType(); et != TypeArray || v.Len() != 3 {
		t.Errorf("nested: elem %s len %d", et, v.Len())
	}
	inner, _ := v.Array()
	if s, ok := inner[1].Strings(); !ok || len(s) != 3 || s[2] != "yz" {
		t.Errorf("nested[1] = %v", inner[1])
	}
	deeper, _ := inner[2].Array()
	if a, ok := deeper[0].Float32s(); !ok || len(a) != 2 || a[1] != 2 {
		t.Errorf("nested[2][0] = %v", deeper[0])
	}
}

func TestValueString(t *testing.T) {
	cases := []struct {
		v    any
		want string
	}{
		{"a\"b", `"a\"b"`},
		{uint8(7), "7"},
		{int64(-3), "-3"},
		{true, "true"},
		{float32(0.5), "0.5"},
		{[]string{"x", "y"}, `[2]string{"x", "y"}`},
		{make([]int32, 10), "[10]int32{0, 0, 0, 0, 0, 0, 0, 0, …}"},
		{[]Value{mustValue(t, []bool{true})}, "[1]array{[1]bool{true}}"},
	}
	for _, c := range cases {
		if got := mustValue(t, c.v).String(); got != c.want {
			t.Errorf("String(%#v) = %s, want %s", c.v, got, c.want)
		}
	}
	if got := ValueType(40).String(); got != "ValueType(40)" {
		t.Errorf("ValueType(40).String() = %s", got)
	}
	if got := TypeFloat64.String(); got != "float64" {
		t.Errorf("TypeFloat64.String() = %s", got)
	}
}

func TestValueAnyAndEqual(t *testing.T) {
	for _, x := range []any{uint8(1), int8(-1), uint16(2), int16(-2), uint32(3), int32(-3), float32(1.5),
		true, "s", uint64(4), int64(-4), 2.5} {
		v := mustValue(t, x)
		if v.Any() != x {
			t.Errorf("Any() = %#v, want %#v", v.Any(), x)
		}
		if v.Len() != 0 {
			t.Errorf("%v: Len() = %d for a scalar", x, v.Len())
		}
		if _, ok := v.ElemType(); ok {
			t.Errorf("%v: ElemType ok for a scalar", x)
		}
	}
	a, b := mustValue(t, []float32{1, 2}), mustValue(t, []float32{1, 2})
	if !a.Equal(b) || a.Equal(mustValue(t, []float32{1, 3})) || a.Equal(mustValue(t, []float64{1, 2})) || a.Equal(mustValue(t, uint8(1))) {
		t.Error("Equal on float32 arrays is wrong")
	}
	if mustValue(t, int32(1)).Equal(mustValue(t, uint32(1))) {
		t.Error("values of different types compare equal")
	}
}

func TestOpenErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := Open(filepath.Join(dir, "missing.gguf")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Open(missing) = %v", err)
	}
	empty := filepath.Join(dir, "empty.gguf")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(empty); !errors.Is(err, ErrTruncated) || !strings.Contains(err.Error(), empty) {
		t.Errorf("Open(empty) = %v", err)
	}
	bad := filepath.Join(dir, "bad.gguf")
	if err := os.WriteFile(bad, header(1, 0, 0).b, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Open(bad)
	var fe *FormatError
	if !errors.As(err, &fe) || !errors.Is(err, ErrUnsupportedVersion) || !strings.Contains(err.Error(), bad) {
		t.Errorf("Open(v1) = %v", err)
	}
}
