#!/usr/bin/env bash
# Builds the pinned code-generation tools (buf and the protoc plugins, versions
# in tools/go.mod) into .bin/. Cold: a few minutes; afterwards: seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
GOWORK=off go -C tools build -o ../.bin/ tool
