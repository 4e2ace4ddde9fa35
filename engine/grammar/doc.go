// Package grammar constrains generation to a formal grammar: it compiles
// GBNF (llama.cpp's notation) and, at every decode step, tells which tokens
// of a model's vocabulary may come next, so that every output is a sentence
// of the grammar. JSON Schemas reach it compiled to GBNF (engine/jsonschema).
//
// # Notation
//
// A grammar is a list of rules `name ::= alternatives`; the start rule is
// "root". Names are letters, digits, '-' (and '_'). A rule ends at the end
// of its line; inside parentheses, and after '|', newlines continue it.
//
//   - "text": a literal, with the escapes \n \t \r \\ \" \[ \] \xNN \uNNNN
//     \UNNNNNNNN (also \- and \^); any other escape is an error.
//   - [a-z0-9_], [^"\\]: a character class, negated with ^; the escapes
//     above work inside it.
//   - . any one character (code point).
//   - name: another rule; ( ... ): a group; a | b: alternatives.
//   - x* x+ x? x{m} x{m,} x{m,n}: repetition of the symbol before.
//   - # comment to the end of the line.
//
// Terminals are Unicode code points; the output is UTF-8. Parse errors
// (*Error) wrap engine.ErrInvalidInput and name the rule and byte offset:
// undefined rules, a missing root, unbalanced brackets or quotes, bad
// escapes, rules defined twice, and left recursion this engine cannot run
// (a rule reaching itself before any character with a return address on
// the stack, e.g. `expr ::= expr "+" term`; tail repetition such as
// `list ::= item ("," item)*` is fine).
//
// # Algorithm
//
// Rules compile to a flat array of elements (character set, rule
// reference, end of alternative); repetitions expand into right-recursive
// or nested-optional helper rules, as in llama.cpp. The parse state is the
// set-of-stacks of llama.cpp's pushdown matcher: every stack's top is the
// character set that must match next, below it the return addresses.
// Stacks are persistent linked lists whose nodes are interned, and a
// reference in tail position pushes nothing, so repetition runs in constant
// depth. Unlike llama.cpp, the sets of stacks are themselves interned into
// the states of a lazily built deterministic automaton: each state has one
// transition per code-point class (the classes are the pieces into which
// the grammar's character sets cut Unicode), computed on first use and
// then shared by every Matcher of the Grammar. Stepping a character is
// then one atomic load. A Matcher's state is a state pointer plus the
// bytes of a UTF-8 character a token left unfinished: a token that ends
// inside a character is allowed when some character the grammar allows
// here starts with those bytes, and the next token must complete it.
//
// # Masks
//
// Vocab holds a byte trie of the tokens, built once per model and shared,
// numbered in pre-order so a subtree's tokens are one span. FillMask walks
// it once from the current state, following only the bytes the automaton
// allows, so rejected subtrees are never visited. Most of the rest is not
// visited either: each wide state (one taking many characters) records a
// run, a set of characters and a length such that every string of at
// most that many characters from the set is allowed (inside a JSON string:
// the characters that keep the state where it is, any length; inside
// [^"]{0,40}: the characters that move one step on, and what is left of
// the count; surrogates aside, as UTF-8 text never holds them), and each
// trie node records the ASCII bytes below it, whether bytes >= 0x80
// occur, whether every path is well-formed UTF-8 and the most characters
// a token below still needs; a node whose subtree fits the run is allowed
// whole, and a child passes the run on with one character used up. The
// mask is then cached on the state (per Vocab); inside a JSON string, or
// any repeated context, the state recurs, so masks are nearly always one
// copy. Allows walks a single token's bytes; a sampler should try the
// unconstrained choice with Allows first and build a mask only when it is
// rejected. Tokens with nil or empty pieces are never allowed; the
// end-of-generation ids are allowed exactly when Complete().
//
// # Limits
//
// Source at most MaxSourceBytes, at most MaxElements compiled elements and
// MaxRules rules, repetition counts at most MaxRepeat, parentheses nested
// at most 512 deep. At run time a stack holds at most 4096 return
// addresses and a state at most 4096 stacks; paths beyond are dropped
// (what stays allowed is still in the language), and which are kept
// depends only on the grammar and the text (stacks are ordered by their
// structure, not by the order a cache interned them), so every worker
// keeps the same. One closure (the start state, or one character's
// transition) visits at most 65536 (position, stack) pairs: Parse refuses
// a grammar whose start state needs more ("too ambiguous", naming a rule),
// and a character whose transition needs more is refused like one the
// grammar does not allow. A Grammar's cache
// (nodes, states, transitions, masks) is bounded by DefaultCacheBytes
// (SetCacheLimit changes it); when full it starts a new generation. The
// old generation's states stay in memory as long as a Matcher still holds
// one of them (each Matcher pins the states it can reach from its own),
// so the bound is on what the cache keeps, not on all memory a grammar's
// live Matchers use. Share one Grammar between the
// requests that use the same source: they then share its cache.
package grammar
