package jsonschema

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"math/big"
	"strings"
)

// kind is the JSON type of a parsed value.
type kind uint8

const (
	kNull kind = iota
	kBool
	kNumber
	kString
	kArray
	kObject
)

// node is a parsed JSON value that keeps object members in document order:
// the grammar emits properties in schema order, which map[string]any loses.
type node struct {
	kind kind
	b    bool
	num  string // the number's text as written (json.Number)
	str  string
	arr  []*node
	obj  []member
}

type member struct {
	key string
	val *node
}

// get returns the member named key, or nil.
func (n *node) get(key string) *node {
	for _, m := range n.obj {
		if m.key == key {
			return m.val
		}
	}
	return nil
}

func (k kind) String() string {
	return [...]string{"null", "boolean", "number", "string", "array", "object"}[k]
}

// parseJSON decodes one JSON document (and nothing after it) into a node
// tree, refusing nesting deeper than maxDepth and duplicate object keys (a
// schema with two "type" members has no single meaning).
func parseJSON(data []byte, maxDepth int) (*node, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	n, err := parseValue(dec, "#", 0, maxDepth)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errorf("#", "", "not valid JSON: data after the schema")
	}
	return n, nil
}

func parseValue(dec *json.Decoder, path string, depth, maxDepth int) (*node, error) {
	if depth > maxDepth {
		return nil, errorf(path, "", "nested deeper than %d levels", maxDepth)
	}
	tok, err := dec.Token()
	if err != nil {
		return nil, errorf(path, "", "not valid JSON: %v", err)
	}
	switch t := tok.(type) {
	case nil:
		return &node{kind: kNull}, nil
	case bool:
		return &node{kind: kBool, b: t}, nil
	case json.Number:
		return &node{kind: kNumber, num: string(t)}, nil
	case string:
		return &node{kind: kString, str: t}, nil
	case json.Delim:
		switch t {
		case '[':
			n := &node{kind: kArray}
			for i := 0; dec.More(); i++ {
				v, err := parseValue(dec, child(path, itoa(i)), depth+1, maxDepth)
				if err != nil {
					return nil, err
				}
				n.arr = append(n.arr, v)
			}
			if _, err := dec.Token(); err != nil {
				return nil, errorf(path, "", "not valid JSON: %v", err)
			}
			return n, nil
		case '{':
			n := &node{kind: kObject}
			seen := map[string]bool{}
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return nil, errorf(path, "", "not valid JSON: %v", err)
				}
				key, _ := kt.(string)
				if seen[key] {
					return nil, errorf(path, key, "appears twice in one object")
				}
				seen[key] = true
				v, err := parseValue(dec, child(path, key), depth+1, maxDepth)
				if err != nil {
					return nil, err
				}
				n.obj = append(n.obj, member{key, v})
			}
			if _, err := dec.Token(); err != nil {
				return nil, errorf(path, "", "not valid JSON: %v", err)
			}
			return n, nil
		}
	}
	return nil, errorf(path, "", "not valid JSON: unexpected %v", tok)
}

// compact writes n as whitespace-free JSON: the text a const or enum value
// must appear as in the output.
func (n *node) compact(sb *strings.Builder) {
	switch n.kind {
	case kNull:
		sb.WriteString("null")
	case kBool:
		if n.b {
			sb.WriteString("true")
		} else {
			sb.WriteString("false")
		}
	case kNumber:
		sb.WriteString(n.num)
	case kString:
		sb.WriteString(quoteJSON(n.str))
	case kArray:
		sb.WriteByte('[')
		for i, v := range n.arr {
			if i > 0 {
				sb.WriteByte(',')
			}
			v.compact(sb)
		}
		sb.WriteByte(']')
	case kObject:
		sb.WriteByte('{')
		for i, m := range n.obj {
			if i > 0 {
				sb.WriteByte(',')
			}
			sb.WriteString(quoteJSON(m.key))
			sb.WriteByte(':')
			m.val.compact(sb)
		}
		sb.WriteByte('}')
	}
}

func (n *node) compactString() string {
	var sb strings.Builder
	n.compact(&sb)
	return sb.String()
}

// quoteJSON encodes s as a JSON string without HTML escaping.
func quoteJSON(s string) string {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s) // a Go string always encodes
	return strings.TrimSuffix(buf.String(), "\n")
}

// rat returns a number node's exact value.
func (n *node) rat() (*big.Rat, bool) {
	if n.kind != kNumber {
		return nil, false
	}
	// big.Rat would expand "1e999999999" digit by digit: refuse exponents
	// no real schema needs before parsing.
	if i := strings.IndexAny(n.num, "eE"); i >= 0 {
		e := strings.TrimLeft(n.num[i+1:], "+-")
		e = strings.TrimLeft(e, "0")
		if len(e) > 3 {
			return nil, false
		}
	}
	return new(big.Rat).SetString(n.num)
}

func itoa(i int) string { return big.NewInt(int64(i)).String() }
