package openai

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode"
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

// pyStr is Python's str() of a template value, which jinja2 prints for
// {{ x }} and the string and join filters use: floats as repr (1.0, 1e+16,
// inf), None and booleans by name, lists and dicts as their repr (strings
// in them quoted as Python quotes them), an undefined value as "".
func pyStr(v jinja.Value) string {
	switch {
	case v.IsUndefined():
		return ""
	case v.IsString():
		return v.AsString()
	}
	var b strings.Builder
	writePyRepr(&b, v)
	return b.String()
}

func writePyRepr(b *strings.Builder, v jinja.Value) {
	switch {
	case v.IsUndefined():
		b.WriteString("Undefined")
	case v.IsNone():
		b.WriteString("None")
	case v.IsBool():
		b.WriteString(map[bool]string{true: "True", false: "False"}[v.AsBool()])
	case v.IsInt():
		b.WriteString(strconv.FormatInt(v.AsInt(), 10))
	case v.IsFloat():
		f := v.AsFloat()
		switch {
		case math.IsNaN(f):
			b.WriteString("nan")
		case math.IsInf(f, 1):
			b.WriteString("inf")
		case math.IsInf(f, -1):
			b.WriteString("-inf")
		default:
			b.WriteString(pyFloat(f))
		}
	case v.IsString():
		writePyStringRepr(b, v.AsString())
	case v.IsList():
		b.WriteByte('[')
		for i, it := range v.AsList().Items {
			if i > 0 {
				b.WriteString(", ")
			}
			writePyRepr(b, it)
		}
		b.WriteByte(']')
	case v.IsDict():
		d := v.AsDict()
		b.WriteByte('{')
		for i, k := range d.OrderedKeys() {
			if i > 0 {
				b.WriteString(", ")
			}
			writePyStringRepr(b, k)
			b.WriteString(": ")
			val, _ := d.Get(k)
			writePyRepr(b, val)
		}
		b.WriteByte('}')
	default:
		b.WriteString(v.String())
	}
}

// writePyStringRepr writes Python's repr of a string: in single quotes,
// or double ones when it holds a single quote and no double one; \\, the
// quote, \t, \n, \r escaped, other characters that are not printable as
// \xNN, \uNNNN or \UNNNNNNNN.
func writePyStringRepr(b *strings.Builder, s string) {
	q := byte('\'')
	if strings.IndexByte(s, '\'') >= 0 && strings.IndexByte(s, '"') < 0 {
		q = '"'
	}
	b.WriteByte(q)
	for _, r := range s {
		switch {
		case r == rune(q) || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == ' ' || unicode.IsPrint(r):
			b.WriteRune(r)
		case r < 0x100:
			fmt.Fprintf(b, `\x%02x`, r)
		case r < 0x10000:
			fmt.Fprintf(b, `\u%04x`, r)
		default:
			fmt.Fprintf(b, `\U%08x`, r)
		}
	}
	b.WriteByte(q)
}

// printValue is the function the pre-pass wraps every {{ expression }} in
// (printFunc): the value as Python's str().
func printValue() jinja.Value {
	return jinja.NewCallable(printFunc, func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		if len(args) != 1 {
			return jinja.Undefined(), fmt.Errorf("print: %d values", len(args))
		}
		return jinja.NewString(pyStr(args[0])), nil
	})
}

// stringFilter is jinja2's string filter: str() of the value.
func stringFilter() jinja.Value {
	return jinja.NewCallable("string", func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		if len(args) != 1 {
			return jinja.Undefined(), fmt.Errorf("string: takes no arguments")
		}
		return jinja.NewString(pyStr(args[0])), nil
	})
}

// joinFilter is jinja2's join(value, d="", attribute=None): the items
// (a string's characters, a dict's keys), or their attribute, as str()
// joined by d.
func joinFilter() jinja.Value {
	return jinja.NewCallable("join", func(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
		if len(args) == 0 || len(args) > 3 {
			return jinja.Undefined(), fmt.Errorf("join: want a value, a separator and an attribute")
		}
		sep, attr := jinja.NewString(""), jinja.Undefined()
		if len(args) > 1 {
			sep = args[1]
		}
		if len(args) > 2 {
			attr = args[2]
		}
		for k, v := range kwargs {
			switch k {
			case "d":
				sep = v
			case "attribute":
				attr = v
			default:
				return jinja.Undefined(), fmt.Errorf("join: unknown argument %s", k)
			}
		}
		var items []jinja.Value
		switch v := args[0]; {
		case v.IsList():
			items = v.AsList().Items
		case v.IsDict():
			for _, k := range v.AsDict().OrderedKeys() {
				items = append(items, jinja.NewString(k))
			}
		case v.IsString():
			for _, r := range v.AsString() {
				items = append(items, jinja.NewString(string(r)))
			}
		default:
			return jinja.Undefined(), fmt.Errorf("join: %s is not iterable", v.String())
		}
		parts := make([]string, len(items))
		for i, it := range items {
			if !attr.IsUndefined() && !attr.IsNone() {
				it = attrOf(it, pyStr(attr))
			}
			parts[i] = pyStr(it)
		}
		return jinja.NewString(strings.Join(parts, pyStr(sep))), nil
	})
}

// attrOf is jinja2's attribute getter: a dotted path of keys (or list
// indexes); undefined where one is missing.
func attrOf(v jinja.Value, path string) jinja.Value {
	for _, part := range strings.Split(path, ".") {
		switch {
		case v.IsDict():
			x, ok := v.AsDict().Get(part)
			if !ok {
				return jinja.Undefined()
			}
			v = x
		case v.IsList():
			n, err := strconv.Atoi(part)
			if err != nil || n < 0 || n >= v.AsList().Len() {
				return jinja.Undefined()
			}
			v = v.AsList().Get(n)
		default:
			return jinja.Undefined()
		}
	}
	return v
}
