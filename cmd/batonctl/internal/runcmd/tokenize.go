package runcmd

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"

	"github.com/baton-serving/baton/engine/tokenizer"
	"github.com/baton-serving/baton/svckit"
)

// TokenizeSummary is the one-line description of `batonctl tokenize`.
const TokenizeSummary = "show the token ids and pieces a model's tokenizer gives a text"

const tokenizeHelp = `Usage: batonctl tokenize --text TEXT [flags]

Tokenizes TEXT with the model's tokenizer, as llama.cpp's llama-tokenize
does: one line per token with its id and its piece (Go-quoted, special
tokens shown), or with --json one object {"ids":[…],"pieces":[…]}.

Flags:`

// Tokenize is the `batonctl tokenize` command.
func Tokenize(ctx context.Context, stdout, stderr io.Writer, args []string) int {
	var (
		modelRef, text         string
		noBOS, noParse, asJSON bool
	)
	fs := flag.NewFlagSet("batonctl tokenize", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&modelRef, "model", "", modelFlagHelp)
	fs.StringVar(&text, "text", "", "the text to tokenize")
	fs.BoolVar(&noBOS, "no-bos", false, "do not add the BOS (and EOS) tokens the model asks for")
	fs.BoolVar(&noParse, "no-parse-special", false, "treat special-token text such as \"<s>\" as plain text")
	fs.BoolVar(&asJSON, "json", false, "print one JSON object instead of a line per token")
	fs.Usage = func() {
		fmt.Fprintln(stderr, tokenizeHelp)
		fs.PrintDefaults()
	}
	if err := svckit.ParseArgs(fs, args); err != nil {
		return flagErr(stderr, "tokenize", err)
	}
	f, err := openModel(ctx, modelRef, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "batonctl tokenize: %s\n", oneLine(err))
		return exitFailed
	}
	defer f.Close()
	tok, err := tokenizer.FromGGUF(f)
	if err != nil {
		fmt.Fprintf(stderr, "batonctl tokenize: %s\n", oneLine(err))
		return exitFailed
	}
	ids := tok.Encode(text, tokenizer.EncodeOptions{AddSpecial: !noBOS, ParseSpecial: !noParse})
	pieces := make([]string, len(ids))
	for i, id := range ids {
		pieces[i] = tok.Piece(id)
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetEscapeHTML(false)
		if ids == nil {
			ids = []int32{}
		}
		if err := enc.Encode(struct {
			IDs    []int32  `json:"ids"`
			Pieces []string `json:"pieces"`
		}{ids, pieces}); err != nil {
			fmt.Fprintf(stderr, "batonctl tokenize: %s\n", oneLine(err))
			return exitFailed
		}
		return exitOK
	}
	for i, id := range ids {
		fmt.Fprintf(stdout, "%6d %q\n", id, pieces[i])
	}
	return exitOK
}
