package jsonschema

import (
	"fmt"
	"math/big"
	"slices"
	"strings"
)

// Limits that keep a hostile schema from taking unbounded time or memory, or
// from producing a grammar engine/grammar refuses. Real tool and response
// schemas are far below each.
const (
	// MaxSchemaBytes bounds the schema text.
	MaxSchemaBytes = 256 << 10
	// MaxDepth bounds JSON nesting in the schema document.
	MaxDepth = 64
	// MaxRules bounds the rules of one compiled grammar.
	MaxRules = 4096
	// MaxGrammarBytes bounds the GBNF source produced.
	MaxGrammarBytes = 512 << 10
	// MaxCount bounds one minLength/maxLength/minItems/maxItems value and
	// one {m,n} count in a pattern.
	MaxCount = 1000
	// maxRepeatBudget bounds the sum of all counts in one grammar: the
	// grammar engine expands x{m,n} into about n elements.
	maxRepeatBudget = 50000
)

// ToGrammar compiles a JSON Schema (OpenAI strict-mode subset, see the
// package doc) to GBNF source for engine/grammar, start rule "root". An
// unsupported or invalid schema is an *Error naming the keyword and its path.
func ToGrammar(schema []byte) (string, error) {
	if len(schema) > MaxSchemaBytes {
		return "", errorf("#", "", "the schema is %d bytes, more than the limit of %d", len(schema), MaxSchemaBytes)
	}
	root, err := parseJSON(schema, MaxDepth)
	if err != nil {
		return "", err
	}
	c := &compiler{
		root:    root,
		byPath:  map[string]string{},
		names:   map[string]bool{},
		used:    map[string]bool{},
		heads:   map[string][]string{},
		kindsOf: map[string]uint8{},
	}
	for name := range prims {
		c.names[name] = true
	}
	if err := c.run(); err != nil {
		return "", err
	}
	return c.out.String(), nil
}

// compiler turns one schema document into grammar rules.
type compiler struct {
	root    *node
	byPath  map[string]string // schema path -> rule name, for $ref targets
	names   map[string]bool   // rule names taken
	rules   []rule
	used    map[string]bool     // shared rules used
	heads   map[string][]string // rule -> rules it may start with (no input consumed)
	kindsOf map[string]uint8    // compiled $ref target -> the kinds it produces
	budget  int                 // repetition counts spent
	size    int                 // bytes of rules defined so far
	out     strings.Builder
}

type rule struct{ name, expr string }

// result is a compiled subschema: its GBNF expression, the rules the
// expression may begin with before consuming input (to reject left
// recursion such as {"$ref": "#"}), and what the values it produces can be,
// for deciding whether oneOf branches are disjoint.
type result struct {
	expr  string
	heads []string
	kinds uint8    // bit per kind that can be produced
	lits  []string // non-nil: exactly these canonical literals
}

func bit(k kind) uint8 { return 1 << k }

const allKinds = 1<<6 - 1

func (c *compiler) run() error {
	c.names["root"] = true
	c.byPath["#"] = "root"
	r, err := c.schema(c.root, "#")
	if err != nil {
		return err
	}
	c.define("root", r)
	if err := c.checkLeftRecursion(); err != nil {
		return err
	}
	// root first, then the rest in the order they were made.
	slices.SortStableFunc(c.rules, func(a, b rule) int {
		if a.name == "root" {
			return -1
		}
		if b.name == "root" {
			return 1
		}
		return 0
	})
	for _, r := range c.rules {
		fmt.Fprintf(&c.out, "%s ::= %s\n", r.name, r.expr)
	}
	for _, name := range primOrder {
		if c.used[name] {
			c.out.WriteString(prims[name].def)
			c.out.WriteByte('\n')
		}
	}
	if c.out.Len() > MaxGrammarBytes {
		return errorf("#", "", "the grammar would be %d bytes, more than the limit of %d", c.out.Len(), MaxGrammarBytes)
	}
	return nil
}

// use marks a shared rule (and what it needs) as used and returns its name.
func (c *compiler) use(name string) string {
	if c.used[name] {
		return name
	}
	c.used[name] = true
	for _, d := range prims[name].deps {
		c.use(d)
	}
	return name
}

// newName reserves a unique rule name derived from hint.
func (c *compiler) newName(hint string) string {
	var sb strings.Builder
	for _, r := range strings.ToLower(hint) {
		switch {
		case 'a' <= r && r <= 'z' || '0' <= r && r <= '9':
			sb.WriteRune(r)
		default:
			if sb.Len() > 0 && !strings.HasSuffix(sb.String(), "-") {
				sb.WriteByte('-')
			}
		}
		if sb.Len() >= 24 {
			break
		}
	}
	base := strings.Trim(sb.String(), "-")
	if base == "" || base[0] >= '0' && base[0] <= '9' {
		base = "r-" + base
	}
	base = strings.TrimSuffix(base, "-")
	name := base
	for i := 1; c.names[name]; i++ {
		name = fmt.Sprintf("%s-%d", base, i)
	}
	c.names[name] = true
	return name
}

func (c *compiler) define(name string, r result) {
	c.size += len(name) + len(r.expr)
	c.rules = append(c.rules, rule{name, r.expr})
	c.heads[name] = r.heads
}

// ruleFor returns r as one symbol: r itself if it already is one, else a new
// rule named from hint.
func (c *compiler) ruleFor(hint, path string, r result) (result, error) {
	if isSymbol(r.expr) {
		return r, nil
	}
	if len(c.rules) >= MaxRules {
		return result{}, errorf(path, "", "the grammar would need more than %d rules", MaxRules)
	}
	name := c.newName(hint)
	c.define(name, r)
	return result{expr: name, heads: []string{name}, kinds: r.kinds, lits: r.lits}, nil
}

func (c *compiler) spend(path, keyword string, n int) error {
	if n > MaxCount {
		return errorf(path, keyword, "%d is above the supported maximum of %d", n, MaxCount)
	}
	c.budget += n
	if c.budget > maxRepeatBudget {
		return errorf(path, keyword, "the schema's length and item bounds add up to more than %d", maxRepeatBudget)
	}
	return nil
}

// checkLeftRecursion refuses a rule that can reach itself without consuming
// input ({"$ref": "#"}, or anyOf branches that refer back): such a grammar
// describes no finite value.
func (c *compiler) checkLeftRecursion() error {
	state := map[string]int{} // 1 visiting, 2 done
	var visit func(string) string
	visit = func(n string) string {
		switch state[n] {
		case 1:
			return n
		case 2:
			return ""
		}
		state[n] = 1
		for _, h := range c.heads[n] {
			if cyc := visit(h); cyc != "" {
				return cyc
			}
		}
		state[n] = 2
		return ""
	}
	names := make([]string, 0, len(c.heads))
	for n := range c.heads {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		if cyc := visit(n); cyc != "" {
			path := "#"
			for p, name := range c.byPath {
				if name == cyc {
					path = p
				}
			}
			return errorf(path, "$ref", "the schema refers to itself without any value in between (a reference cycle through $ref/anyOf only)")
		}
	}
	return nil
}

// Keyword sets.
var (
	annotationKeywords = map[string]bool{
		"description": true, "title": true, "default": true, "examples": true,
		"$schema": true, "$id": true, "$comment": true, "deprecated": true,
		"readOnly": true, "writeOnly": true, "$defs": true, "definitions": true,
	}
	valueKeywords = map[string]bool{
		"type": true, "enum": true, "const": true, "anyOf": true, "oneOf": true, "allOf": true, "$ref": true,
		"properties": true, "required": true, "additionalProperties": true,
		"items": true, "minItems": true, "maxItems": true, "uniqueItems": true,
		"minLength": true, "maxLength": true, "pattern": true, "format": true,
		"minimum": true, "maximum": true, "exclusiveMinimum": true, "exclusiveMaximum": true,
	}
	// keywordKind says which type a type-specific keyword constrains, to
	// infer "type" when a schema leaves it out.
	keywordKind = map[string]kind{
		"properties": kObject, "required": kObject, "additionalProperties": kObject,
		"items": kArray, "minItems": kArray, "maxItems": kArray, "uniqueItems": kArray,
		"minLength": kString, "maxLength": kString, "pattern": kString, "format": kString,
		"minimum": kNumber, "maximum": kNumber, "exclusiveMinimum": kNumber, "exclusiveMaximum": kNumber,
	}
	typeNames = []string{"null", "boolean", "object", "array", "number", "integer", "string"}
)

// schema compiles the subschema n found at path.
func (c *compiler) schema(n *node, path string) (result, error) {
	if c.size > MaxGrammarBytes {
		return result{}, errorf(path, "", "the grammar would be more than %d bytes", MaxGrammarBytes)
	}
	switch n.kind {
	case kBool:
		if !n.b {
			return result{}, errorf(path, "", "the schema false admits no value")
		}
		return result{expr: c.use("value"), kinds: allKinds}, nil
	case kObject:
	default:
		return result{}, errorf(path, "", "a schema must be an object or a boolean, not %s", n.kind)
	}
	var constraints []string // value keywords present, in schema order
	for _, m := range n.obj {
		switch {
		case annotationKeywords[m.key]:
			if (m.key == "$defs" || m.key == "definitions") && m.val.kind != kObject {
				return result{}, errorf(path, m.key, "must be an object of schemas")
			}
		case valueKeywords[m.key]:
			constraints = append(constraints, m.key)
		default:
			return result{}, errorf(path, m.key, "is not supported%s", unsupportedHint(m.key))
		}
	}
	// Keywords that stand alone: everything else beside them would need
	// intersecting two schemas.
	for _, kw := range []string{"$ref", "anyOf", "oneOf", "allOf"} {
		if n.get(kw) == nil {
			continue
		}
		for _, other := range constraints {
			if other != kw {
				return result{}, errorf(path, other, "is not supported beside %s (move it into the referenced or combined schemas)", kw)
			}
		}
		switch kw {
		case "$ref":
			return c.ref(n.get(kw), path)
		case "allOf":
			v := n.get(kw)
			if v.kind != kArray || len(v.arr) != 1 {
				return result{}, errorf(path, kw, "is supported only with exactly one schema (intersections are not)")
			}
			return c.schema(v.arr[0], child(child(path, kw), "0"))
		default:
			return c.anyOf(n.get(kw), child(path, kw), kw)
		}
	}
	types, err := c.types(n, path, constraints)
	if err != nil {
		return result{}, err
	}
	if n.get("enum") != nil || n.get("const") != nil {
		return c.literals(n, path, types, constraints)
	}
	var alts []result
	for _, t := range types {
		var r result
		var err error
		switch t {
		case "null":
			r = result{expr: c.use("null"), kinds: bit(kNull)}
		case "boolean":
			r = result{expr: c.use("boolean"), kinds: bit(kBool)}
		case "string":
			r, err = c.str(n, path)
		case "integer":
			r, err = c.integer(n, path)
		case "number":
			r, err = c.number(n, path)
		case "array":
			r, err = c.array(n, path)
		case "object":
			r, err = c.object(n, path)
		}
		if err != nil {
			return result{}, err
		}
		alts = append(alts, r)
	}
	return union(alts), nil
}

func union(alts []result) result {
	if len(alts) == 1 {
		return alts[0]
	}
	var u result
	exprs := make([]string, len(alts))
	for i, a := range alts {
		exprs[i] = a.expr
		u.heads = append(u.heads, a.heads...)
		u.kinds |= a.kinds
	}
	u.expr = alternatives(exprs)
	return u
}

func unsupportedHint(kw string) string {
	switch kw {
	case "patternProperties", "propertyNames", "minProperties", "maxProperties", "dependentRequired",
		"dependentSchemas", "unevaluatedProperties", "dependencies":
		return " (objects support properties, required and additionalProperties)"
	case "prefixItems", "contains", "minContains", "maxContains", "unevaluatedItems", "additionalItems":
		return " (arrays support items, minItems and maxItems)"
	case "multipleOf":
		return " (numbers support minimum/maximum on integers and minimum 0 on numbers)"
	case "not", "if", "then", "else":
		return " (use anyOf)"
	case "$anchor", "$dynamicRef", "$dynamicAnchor", "$recursiveRef", "$recursiveAnchor", "$vocabulary":
		return " (use $ref to \"#/$defs/NAME\")"
	case "nullable":
		return " (use \"type\": [\"...\", \"null\"])"
	}
	return ""
}

// types returns the JSON types the schema allows, in a fixed order:
// "type" as given, or inferred from type-specific keywords, or all.
func (c *compiler) types(n *node, path string, constraints []string) ([]string, error) {
	t := n.get("type")
	var list []string
	switch {
	case t == nil:
		var kinds []kind
		for _, kw := range constraints {
			if k, ok := keywordKind[kw]; ok && !slices.Contains(kinds, k) {
				kinds = append(kinds, k)
			}
		}
		switch len(kinds) {
		case 0:
			return []string{"null", "boolean", "object", "array", "number", "string"}, nil
		case 1:
			return []string{map[kind]string{kObject: "object", kArray: "array", kString: "string", kNumber: "number"}[kinds[0]]}, nil
		default:
			return nil, errorf(path, "type", "is needed: the schema has keywords for both %s and %s values", kinds[0], kinds[1])
		}
	case t.kind == kString:
		list = []string{t.str}
	case t.kind == kArray && len(t.arr) > 0:
		for _, e := range t.arr {
			if e.kind != kString {
				return nil, errorf(path, "type", "must be a type name or an array of type names")
			}
			list = append(list, e.str)
		}
	default:
		return nil, errorf(path, "type", "must be a type name or a non-empty array of type names")
	}
	seen := map[string]bool{}
	for _, s := range list {
		if !slices.Contains(typeNames, s) {
			return nil, errorf(path, "type", "%q is not a JSON Schema type", s)
		}
		if seen[s] {
			return nil, errorf(path, "type", "%q is listed twice", s)
		}
		seen[s] = true
	}
	if seen["number"] && seen["integer"] {
		delete(seen, "integer") // every integer is a number
	}
	var out []string
	for _, s := range typeNames {
		if seen[s] {
			out = append(out, s)
		}
	}
	return out, nil
}

// literals compiles enum and const: the exact values, written compactly,
// kept only where they have one of the allowed types.
func (c *compiler) literals(n *node, path string, types []string, constraints []string) (result, error) {
	for _, kw := range constraints {
		if kw != "type" && kw != "enum" && kw != "const" {
			return result{}, errorf(path, kw, "is not supported beside enum or const")
		}
	}
	var vals []*node
	if e := n.get("enum"); e != nil {
		if e.kind != kArray || len(e.arr) == 0 {
			return result{}, errorf(path, "enum", "must be a non-empty array")
		}
		vals = e.arr
	}
	if k := n.get("const"); k != nil {
		if vals != nil && !slices.ContainsFunc(vals, func(v *node) bool { return canonical(v) == canonical(k) }) {
			return result{}, errorf(path, "const", "is not one of the enum values, so no value matches")
		}
		vals = []*node{k}
	}
	var r result
	r.lits = []string{}
	var exprs []string
	seen := map[string]bool{}
	for _, v := range vals {
		if !hasType(v, types) {
			continue
		}
		key := canonical(v)
		if seen[key] {
			continue
		}
		seen[key] = true
		exprs = append(exprs, gbnfLit(v.compactString()))
		r.lits = append(r.lits, key)
		r.kinds |= bit(v.kind)
	}
	kw := "enum"
	if n.get("const") != nil {
		kw = "const"
	}
	if len(exprs) == 0 {
		return result{}, errorf(path, kw, "no value has the schema's type, so no value matches")
	}
	r.expr = alternatives(exprs)
	return r, nil
}

// hasType reports whether a literal has one of the types.
func hasType(v *node, types []string) bool {
	for _, t := range types {
		switch t {
		case "null":
			if v.kind == kNull {
				return true
			}
		case "boolean":
			if v.kind == kBool {
				return true
			}
		case "string":
			if v.kind == kString {
				return true
			}
		case "array":
			if v.kind == kArray {
				return true
			}
		case "object":
			if v.kind == kObject {
				return true
			}
		case "number":
			if v.kind == kNumber {
				return true
			}
		case "integer":
			if r, ok := v.rat(); ok && r.IsInt() {
				return true
			}
		}
	}
	return false
}

// canonical is a literal's identity for JSON equality: numbers by value,
// object members in key order.
func canonical(v *node) string {
	switch v.kind {
	case kNumber:
		if r, ok := v.rat(); ok {
			return "n" + r.RatString()
		}
		return "n" + v.num
	case kArray:
		parts := make([]string, len(v.arr))
		for i, e := range v.arr {
			parts[i] = canonical(e)
		}
		return "[" + strings.Join(parts, ",") + "]"
	case kObject:
		parts := make([]string, len(v.obj))
		for i, m := range v.obj {
			parts[i] = quoteJSON(m.key) + ":" + canonical(m.val)
		}
		slices.Sort(parts)
		return "{" + strings.Join(parts, ",") + "}"
	}
	return v.compactString()
}

// anyOf compiles anyOf, and oneOf when its branches cannot overlap (then
// "exactly one" and "at least one" are the same).
func (c *compiler) anyOf(v *node, path, kw string) (result, error) {
	if v.kind != kArray || len(v.arr) == 0 {
		return result{}, errorf(path, kw, "must be a non-empty array of schemas")
	}
	parent := strings.TrimSuffix(path, "/"+kw)
	var alts []result
	for i, s := range v.arr {
		r, err := c.schema(s, child(path, itoa(i)))
		if err != nil {
			return result{}, err
		}
		if kw == "oneOf" {
			for j, prev := range alts {
				if !disjoint(prev, r) {
					return result{}, errorf(parent, kw, "branches %d and %d may match the same value; only branches of different types or distinct constants are supported (use anyOf)", j, i)
				}
			}
		}
		alts = append(alts, r)
	}
	u := union(alts)
	if kw == "anyOf" || len(alts) == 1 {
		u.lits = nil
		if len(alts) == 1 {
			u.lits = alts[0].lits
		}
	}
	return u, nil
}

func disjoint(a, b result) bool {
	switch {
	case a.lits != nil && b.lits != nil:
		for _, x := range a.lits {
			if slices.Contains(b.lits, x) {
				return false
			}
		}
		return true
	case a.lits != nil:
		return a.kinds&b.kinds == 0
	case b.lits != nil:
		return a.kinds&b.kinds == 0
	}
	return a.kinds&b.kinds == 0
}

// ref resolves a local JSON pointer reference and compiles its target once,
// as a rule named after it, so recursive schemas become recursive rules.
func (c *compiler) ref(v *node, path string) (result, error) {
	if v.kind != kString {
		return result{}, errorf(path, "$ref", "must be a string")
	}
	target := v.str
	if target != "#" && !strings.HasPrefix(target, "#/") {
		return result{}, errorf(path, "$ref", "%q is not supported: only references inside the schema (\"#/$defs/NAME\") are", target)
	}
	if name, ok := c.byPath[target]; ok {
		k, done := c.kindsOf[target]
		if !done {
			k = allKinds // still being compiled: not known yet
		}
		return result{expr: name, heads: []string{name}, kinds: k}, nil
	}
	n := c.root
	if target != "#" {
		for _, tok := range strings.Split(target[2:], "/") {
			tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
			var next *node
			switch n.kind {
			case kObject:
				next = n.get(tok)
			case kArray:
				var i int
				if _, err := fmt.Sscanf(tok, "%d", &i); err == nil && i >= 0 && i < len(n.arr) && itoa(i) == tok {
					next = n.arr[i]
				}
			}
			if next == nil {
				return result{}, errorf(path, "$ref", "%q points at nothing in the schema", target)
			}
			n = next
		}
	}
	if len(c.rules) >= MaxRules {
		return result{}, errorf(path, "", "the grammar would need more than %d rules", MaxRules)
	}
	segs := strings.Split(target, "/")
	name := c.newName(segs[len(segs)-1])
	c.byPath[target] = name
	r, err := c.schema(n, target)
	if err != nil {
		return result{}, err
	}
	c.define(name, r)
	c.kindsOf[target] = r.kinds
	return result{expr: name, heads: []string{name}, kinds: r.kinds, lits: r.lits}, nil
}

// count reads a non-negative integer keyword, or -1 if absent.
func count(n *node, path, kw string) (int, error) {
	v := n.get(kw)
	if v == nil {
		return -1, nil
	}
	r, ok := v.rat()
	if !ok && hugePositive(v) {
		return 0, errorf(path, kw, "%s is above the supported maximum of %d", v.num, MaxCount)
	}
	if !ok || !r.IsInt() || r.Sign() < 0 {
		return 0, errorf(path, kw, "must be a non-negative integer")
	}
	if !r.Num().IsInt64() || r.Num().Int64() > 1<<30 {
		return 0, errorf(path, kw, "%s is above the supported maximum of %d", v.num, MaxCount)
	}
	return int(r.Num().Int64()), nil
}

// hugePositive reports whether n is a number rat refused for its
// exponent that is positive and at least 1 (1e5000, not -1e5000 or
// 1e-5000).
func hugePositive(n *node) bool {
	if n.kind != kNumber || strings.HasPrefix(n.num, "-") {
		return false
	}
	i := strings.IndexAny(n.num, "eE")
	return i >= 0 && !strings.HasPrefix(n.num[i+1:], "-") && strings.Trim(n.num[:i], "0.") != ""
}

// bounds reads a min/max keyword pair.
func bounds(n *node, path, minKW, maxKW string) (lo, hi int, err error) {
	if lo, err = count(n, path, minKW); err != nil {
		return 0, 0, err
	}
	if hi, err = count(n, path, maxKW); err != nil {
		return 0, 0, err
	}
	if lo < 0 {
		lo = 0
	}
	if hi >= 0 && hi < lo {
		return 0, 0, errorf(path, maxKW, "is below %s, so no value matches", minKW)
	}
	return lo, hi, nil
}

func (c *compiler) str(n *node, path string) (result, error) {
	res := result{kinds: bit(kString)}
	lo, hi, err := bounds(n, path, "minLength", "maxLength")
	if err != nil {
		return result{}, err
	}
	bounded := lo > 0 || hi >= 0
	if f := n.get("format"); f != nil {
		if f.kind != kString {
			return result{}, errorf(path, "format", "must be a string")
		}
		if f.str != "uuid" {
			return result{}, errorf(path, "format", "format %q is not supported (only \"uuid\" is; use pattern)", f.str)
		}
		if bounded || n.get("pattern") != nil {
			return result{}, errorf(path, "format", "is not supported together with minLength, maxLength or pattern")
		}
		h := c.use("hex")
		res.expr = fmt.Sprintf(`"\"" %s{8} "-" %s{4} "-" %s{4} "-" %s{4} "-" %s{12} "\""`, h, h, h, h, h)
		return res, nil
	}
	if p := n.get("pattern"); p != nil {
		if p.kind != kString {
			return result{}, errorf(path, "pattern", "must be a string")
		}
		if bounded {
			return result{}, errorf(path, "pattern", "is not supported together with minLength or maxLength (bound the length in the pattern)")
		}
		body, err := c.pattern(p.str, path)
		if err != nil {
			return result{}, err
		}
		res.expr = `"\"" ` + body + ` "\""`
		return res, nil
	}
	if !bounded {
		res.expr = c.use("string")
		return res, nil
	}
	if err := c.spend(path, "maxLength", max(lo, hi)); err != nil {
		return result{}, err
	}
	res.expr = `"\"" ` + repeat(c.use("char"), lo, hi) + ` "\""`
	return res, nil
}

func (c *compiler) array(n *node, path string) (result, error) {
	res := result{kinds: bit(kArray)}
	if u := n.get("uniqueItems"); u != nil && !(u.kind == kBool && !u.b) {
		return result{}, errorf(path, "uniqueItems", "is supported only as false")
	}
	lo, hi, err := bounds(n, path, "minItems", "maxItems")
	if err != nil {
		return result{}, err
	}
	item := result{expr: c.use("value")}
	if it := n.get("items"); it != nil {
		if it.kind == kArray {
			return result{}, errorf(path, "items", "must be one schema (tuple forms are not supported)")
		}
		r, err := c.schema(it, child(path, "items"))
		if err != nil {
			return result{}, err
		}
		if item, err = c.ruleFor(lastToken(path)+"-item", path, r); err != nil {
			return result{}, err
		}
	}
	ws := c.use("ws")
	x := item.expr + " " + ws
	more := `"," ` + ws + " " + x
	if hi == 0 {
		res.expr = `"[" ` + ws + ` "]"`
		return res, nil
	}
	if err := c.spend(path, "maxItems", max(lo, hi)); err != nil {
		return result{}, err
	}
	rest := func(lo int) int {
		if hi < 0 {
			return -1
		}
		return hi - 1
	}
	var body string
	if lo == 0 {
		body = "(" + x + " " + repeat("("+more+")", 0, rest(0)) + ")?"
	} else {
		body = x + " " + repeat("("+more+")", lo-1, rest(lo))
	}
	res.expr = `"[" ` + ws + " " + body + ` "]"`
	return res, nil
}

func lastToken(path string) string {
	i := strings.LastIndexByte(path, '/')
	return path[i+1:]
}

func (c *compiler) object(n *node, path string) (result, error) {
	res := result{kinds: bit(kObject)}
	closed := false
	if ap := n.get("additionalProperties"); ap != nil {
		switch {
		case ap.kind == kBool:
			closed = !ap.b
		case ap.kind == kObject && len(ap.obj) == 0:
		default:
			return result{}, errorf(path, "additionalProperties", "is supported only as false or true (a schema for extra properties is not)")
		}
	}
	props := n.get("properties")
	if props != nil && props.kind != kObject {
		return result{}, errorf(path, "properties", "must be an object of schemas")
	}
	required := map[string]bool{}
	if rq := n.get("required"); rq != nil {
		if rq.kind != kArray {
			return result{}, errorf(path, "required", "must be an array of property names")
		}
		for _, e := range rq.arr {
			if e.kind != kString {
				return result{}, errorf(path, "required", "must be an array of property names")
			}
			if required[e.str] {
				return result{}, errorf(path, "required", "names %q twice", e.str)
			}
			if props == nil || props.get(e.str) == nil {
				return result{}, errorf(path, "required", "names %q, which is not in properties (required properties must be declared)", e.str)
			}
			required[e.str] = true
		}
	}
	ws := c.use("ws")
	if props == nil || len(props.obj) == 0 {
		if closed {
			res.expr = `"{" ` + ws + ` "}"`
		} else {
			res.expr = c.use("object")
		}
		return res, nil
	}
	// One member per property: "key" ws ":" ws value ws.
	type prop struct {
		member string
		req    bool
	}
	ps := make([]prop, len(props.obj))
	for i, m := range props.obj {
		pp := child(child(path, "properties"), m.key)
		r, err := c.schema(m.val, pp)
		if err != nil {
			return result{}, err
		}
		if r, err = c.ruleFor(lastToken(path)+"-"+m.key, pp, r); err != nil {
			return result{}, err
		}
		ps[i] = prop{gbnfLit(quoteJSON(m.key)) + " " + ws + ` ":" ` + ws + " " + r.expr + " " + ws, required[m.key]}
	}
	// seq(i, comma) is the members from i on, where comma says a member has
	// been written already (so the next one needs a leading ","). An
	// optional member is a rule: itself then the rest, or just the rest;
	// the two differ in their first key, so the grammar stays unambiguous.
	memo := map[[2]int]string{}
	base := c.newName(lastToken(path) + "-members")
	var seq func(i int, comma bool) (string, error)
	seq = func(i int, comma bool) (string, error) {
		var parts []string
		for ; i < len(ps); i++ {
			lead := ""
			if comma {
				lead = `"," ` + ws + " "
			}
			if ps[i].req {
				parts = append(parts, lead+ps[i].member)
				comma = true
				continue
			}
			key := [2]int{i, 0}
			if comma {
				key[1] = 1
			}
			name, ok := memo[key]
			if !ok {
				if len(c.rules) >= MaxRules {
					return "", errorf(path, "properties", "the grammar would need more than %d rules", MaxRules)
				}
				name = fmt.Sprintf("%s-%d", base, i)
				if comma {
					name += "-c"
				}
				if c.names[name] {
					name = c.newName(name)
				}
				c.names[name] = true
				memo[key] = name
				with, err := seq(i+1, true)
				if err != nil {
					return "", err
				}
				without, err := seq(i+1, comma)
				if err != nil {
					return "", err
				}
				first := lead + ps[i].member
				if with != "" {
					first += " " + with
				}
				expr := "(" + first + ")?"
				if without != "" {
					expr = first + " | " + without
				}
				c.define(name, result{expr: expr})
			}
			parts = append(parts, name)
			break
		}
		return strings.Join(parts, " "), nil
	}
	body, err := seq(0, false)
	if err != nil {
		return result{}, err
	}
	res.expr = `"{" ` + ws + " " + body + ` "}"`
	return res, nil
}

// integer compiles an integer, bounded by minimum/maximum (and the
// exclusive forms) when given.
func (c *compiler) integer(n *node, path string) (result, error) {
	res := result{kinds: bit(kNumber)}
	lo, hi, err := intBounds(n, path)
	if err != nil {
		return result{}, err
	}
	if lo == nil && hi == nil {
		res.expr = c.use("integer")
		return res, nil
	}
	if lo != nil && hi != nil && lo.Cmp(hi) > 0 {
		return result{}, errorf(path, "maximum", "is below minimum, so no integer matches")
	}
	res.expr = intRange(lo, hi)
	return res, nil
}

// intBounds reads the inclusive integer bounds (nil: none).
func intBounds(n *node, path string) (lo, hi *big.Int, err error) {
	limit := new(big.Int).SetUint64(1e18)
	get := func(kw string, upper, exclusive bool) (*big.Int, error) {
		v := n.get(kw)
		if v == nil {
			return nil, nil
		}
		r, ok := v.rat()
		if !ok {
			return nil, errorf(path, kw, "must be a number")
		}
		// Round inward: ceil for a lower bound, floor for an upper one.
		q := new(big.Int).Quo(r.Num(), r.Denom()) // truncates toward zero
		if !r.IsInt() {
			if !upper && r.Sign() > 0 {
				q.Add(q, big.NewInt(1))
			}
			if upper && r.Sign() < 0 {
				q.Sub(q, big.NewInt(1))
			}
		} else if exclusive {
			if upper {
				q.Sub(q, big.NewInt(1))
			} else {
				q.Add(q, big.NewInt(1))
			}
		}
		if new(big.Int).Abs(q).Cmp(limit) > 0 {
			return nil, errorf(path, kw, "is beyond the supported range of ±1e18")
		}
		return q, nil
	}
	tighter := func(a, b *big.Int, upper bool) *big.Int {
		switch {
		case a == nil:
			return b
		case b == nil:
			return a
		case (a.Cmp(b) < 0) == upper:
			return a
		}
		return b
	}
	var x, y *big.Int
	if x, err = get("minimum", false, false); err != nil {
		return
	}
	if y, err = get("exclusiveMinimum", false, true); err != nil {
		return
	}
	lo = tighter(x, y, false)
	if x, err = get("maximum", true, false); err != nil {
		return
	}
	if y, err = get("exclusiveMaximum", true, true); err != nil {
		return
	}
	hi = tighter(x, y, true)
	return lo, hi, nil
}

// number compiles a number. Bounds are cheap only as "minimum": 0 (no minus
// sign); others are refused by name.
func (c *compiler) number(n *node, path string) (result, error) {
	res := result{kinds: bit(kNumber)}
	for _, kw := range []string{"maximum", "exclusiveMinimum", "exclusiveMaximum"} {
		if n.get(kw) != nil {
			return result{}, errorf(path, kw, "is not supported on numbers (only on integers; numbers support \"minimum\": 0)")
		}
	}
	if m := n.get("minimum"); m != nil {
		r, ok := m.rat()
		if !ok {
			return result{}, errorf(path, "minimum", "must be a number")
		}
		if r.Sign() != 0 {
			return result{}, errorf(path, "minimum", "is supported on numbers only as 0 (on integers, any bound is)")
		}
		res.expr = `("0" | [1-9] [0-9]*) ("." [0-9]+)? ([eE] [\x2B\x2D]? [0-9]{1,3})?`
		return res, nil
	}
	res.expr = c.use("number")
	return res, nil
}
