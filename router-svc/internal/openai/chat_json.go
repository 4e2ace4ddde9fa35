package openai

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/ardanlabs/jinja"
)

// tojsonFilter is the tojson filter as Hugging Face defines it for chat
// templates: Python's json.dumps(x, ensure_ascii=False, indent=indent,
// separators=separators, sort_keys=sort_keys). It replaces the engine's
// own, whose indented form (Llama 3.x's `t | tojson(indent=4)`, the tool
// list) sorts the keys, escapes <, > and & as \u003c… and prints floats
// in Go's style, and which turns a value it cannot encode into "" instead
// of an error.
func tojsonFilter() jinja.Value {
	return jinja.NewCallable("tojson", func(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
		if len(args) == 0 {
			return jinja.Undefined(), fmt.Errorf("tojson: no value")
		}
		o := jsonOptions{itemSep: ", ", keySep: ": "}
		// Positional arguments after the value, as Python takes them:
		// tojson(indent) — Hugging Face's signature is (x, ensure_ascii,
		// indent, separators, sort_keys); only indent is used positionally
		// in practice, so take a lone int as indent.
		rest := args[1:]
		if len(rest) == 1 && rest[0].IsInt() {
			kwargs = withKw(kwargs, "indent", rest[0])
		} else if len(rest) > 0 {
			return jinja.Undefined(), fmt.Errorf("tojson: unexpected positional arguments; use indent=, separators=, sort_keys=")
		}
		for k, v := range kwargs {
			switch k {
			case "indent":
				switch {
				case v.IsNone() || v.IsUndefined():
				case v.IsInt():
					o.indent = strings.Repeat(" ", int(max(v.AsInt(), 0)))
					o.indented = true
				case v.IsString():
					o.indent, o.indented = v.AsString(), true
				default:
					return jinja.Undefined(), fmt.Errorf("tojson: indent must be an int or a string")
				}
			case "separators":
				if v.IsNone() {
					continue
				}
				if !v.IsList() || v.AsList().Len() != 2 || !v.AsList().Get(0).IsString() || !v.AsList().Get(1).IsString() {
					return jinja.Undefined(), fmt.Errorf("tojson: separators must be two strings")
				}
				o.itemSep, o.keySep = v.AsList().Get(0).AsString(), v.AsList().Get(1).AsString()
				o.sepsGiven = true
			case "sort_keys":
				o.sortKeys = v.IsTruthy()
			case "ensure_ascii":
				o.ascii = v.IsTruthy()
			default:
				return jinja.Undefined(), fmt.Errorf("tojson: unknown argument %s", k)
			}
		}
		if o.indented && !o.sepsGiven {
			o.itemSep = "," // Python's default item separator with an indent
		}
		var b strings.Builder
		if err := o.encode(&b, args[0], 0); err != nil {
			return jinja.Undefined(), fmt.Errorf("tojson: %w", err)
		}
		return jinja.NewString(b.String()), nil
	})
}

func withKw(kw map[string]jinja.Value, k string, v jinja.Value) map[string]jinja.Value {
	out := make(map[string]jinja.Value, len(kw)+1)
	for a, b := range kw {
		out[a] = b
	}
	out[k] = v
	return out
}

type jsonOptions struct {
	itemSep, keySep string
	sepsGiven       bool
	indent          string
	indented        bool
	sortKeys        bool
	ascii           bool
}

func (o *jsonOptions) newline(b *strings.Builder, level int) {
	if o.indented {
		b.WriteByte('\n')
		for range level {
			b.WriteString(o.indent)
		}
	}
}

func (o *jsonOptions) encode(b *strings.Builder, v jinja.Value, level int) error {
	switch {
	case v.IsNone():
		b.WriteString("null")
	case v.IsBool():
		b.WriteString(strconv.FormatBool(v.AsBool()))
	case v.IsInt():
		b.WriteString(strconv.FormatInt(v.AsInt(), 10))
	case v.IsFloat():
		b.WriteString(pyFloat(v.AsFloat()))
	case v.IsString():
		writePyString(b, v.AsString(), o.ascii)
	case v.IsList():
		items := v.AsList().Items
		if len(items) == 0 {
			b.WriteString("[]")
			return nil
		}
		b.WriteByte('[')
		for i, it := range items {
			if i > 0 {
				b.WriteString(o.itemSep)
			}
			o.newline(b, level+1)
			if err := o.encode(b, it, level+1); err != nil {
				return err
			}
		}
		o.newline(b, level)
		b.WriteByte(']')
	case v.IsDict():
		d := v.AsDict()
		keys := d.OrderedKeys()
		if len(keys) == 0 {
			b.WriteString("{}")
			return nil
		}
		if o.sortKeys {
			keys = append([]string(nil), keys...)
			sort.Strings(keys)
		}
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteString(o.itemSep)
			}
			o.newline(b, level+1)
			writePyString(b, k, o.ascii)
			b.WriteString(o.keySep)
			val, _ := d.Get(k)
			if err := o.encode(b, val, level+1); err != nil {
				return err
			}
		}
		o.newline(b, level)
		b.WriteByte('}')
	case v.IsUndefined():
		return fmt.Errorf("an undefined value is not JSON serializable")
	default:
		return fmt.Errorf("a %s is not JSON serializable", v.String())
	}
	return nil
}

// pyFloat is Python's repr of a float, which json.dumps writes: the
// shortest digits that round-trip, in positional notation when the decimal
// exponent is in [-4, 16) (always with a fractional part, "2.0"), else as
// "1e+16" / "1e-05"; Infinity and NaN as Python writes them.
func pyFloat(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	s := strconv.FormatFloat(f, 'e', -1, 64) // [-]d[.ddd]e±XX
	neg := s[0] == '-'
	if neg {
		s = s[1:]
	}
	mant, expText, _ := strings.Cut(s, "e")
	exp, _ := strconv.Atoi(expText)
	digits := strings.Replace(mant, ".", "", 1)
	var out string
	switch {
	case exp >= -4 && exp < 16:
		if exp < 0 {
			out = "0." + strings.Repeat("0", -exp-1) + digits
		} else if len(digits) <= exp+1 {
			out = digits + strings.Repeat("0", exp+1-len(digits)) + ".0"
		} else {
			out = digits[:exp+1] + "." + digits[exp+1:]
		}
	default:
		sign := "+"
		if exp < 0 {
			sign, exp = "-", -exp
		}
		out = fmt.Sprintf("%se%s%02d", mant, sign, exp)
	}
	if neg {
		return "-" + out
	}
	return out
}

// writePyString writes s as json.dumps does: ", \ and the control
// characters escaped (\n, \r, \t, \b, \f by name, the rest as \u00XX),
// everything else as it is — or, with ascii, every non-ASCII character as
// \uXXXX (surrogate pairs above U+FFFF).
func writePyString(b *strings.Builder, s string, ascii bool) {
	b.WriteByte('"')
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		i += size
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		default:
			switch {
			case r < 0x20:
				fmt.Fprintf(b, `\u%04x`, r)
			case ascii && r > 0x7e && r < 0x10000:
				fmt.Fprintf(b, `\u%04x`, r)
			case ascii && r >= 0x10000:
				r -= 0x10000
				fmt.Fprintf(b, `\u%04x\u%04x`, 0xd800+(r>>10), 0xdc00+(r&0x3ff))
			default:
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
}
