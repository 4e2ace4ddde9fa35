#!/usr/bin/env bash
# Runs every check Baton's CI runs, in order. Needs Go and gcc; everything
# else (buf, protoc plugins) is built from the pinned tools module.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.bin:$PATH"

step() { printf '\n== %s\n' "$*"; }
# Every module of the workspace, as package patterns.
mapfile -t pkgs < <(go list -m -f '{{.Dir}}/...')

step "codegen tools"
scripts/tools.sh

step "buf lint"
buf lint

step "buf generate is reproducible and gen/ is fresh"
scripts/generate.sh --check

step "gofmt"
unformatted=$(gofmt -l $(git ls-files '*.go'))
if [[ -n "$unformatted" ]]; then
  echo "not gofmt-clean:" >&2
  echo "$unformatted" >&2
  exit 1
fi

step "go vet"
go vet "${pkgs[@]}"
go vet -tags e2e ./tests/...

step "go test -race"
go test -race -count=1 "${pkgs[@]}"

step "kernels, pure-Go build (the fallback every fast path is checked against)"
go test -count=1 -tags purego ./kernels/...

step "fuzz (bounded)"
fuzz() { # package target seconds
  local listed
  listed=$(go test -list "^$2\$" "$1")
  if ! grep -qx "$2" <<<"$listed"; then
    echo "fuzz target $2 not found in $1" >&2
    exit 1
  fi
  go test -run='^$' -fuzz="^$2\$" -fuzztime="$3s" "$1"
}
fuzz ./engine/gguf FuzzOpen 20
fuzz ./engine/tokenizer FuzzEncode 20
fuzz ./engine/sample FuzzStopper 10

step "end-to-end (real binaries)"
go test -tags e2e -count=1 -v ./tests/...
