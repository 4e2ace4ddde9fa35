#!/usr/bin/env bash
# Regenerates gen/ from proto/ with buf and the pinned plugins.
#   scripts/generate.sh          write gen/
#   scripts/generate.sh --check  fail if gen/ differs from a fresh generation
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/tools.sh
export PATH="$PWD/.bin:$PATH"
if [[ "${1:-}" == "--check" ]]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  buf generate -o "$tmp"
  if ! diff -r "$tmp/gen/baton" gen/baton || ! diff "$tmp/gen/openapi/baton.swagger.json" gen/openapi/baton.swagger.json; then
    echo "gen/ is stale: run scripts/generate.sh and commit the result" >&2
    exit 1
  fi
  echo "gen/ is up to date"
else
  rm -rf gen/baton gen/openapi/baton.swagger.json
  buf generate
fi
