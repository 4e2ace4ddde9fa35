#!/usr/bin/env bash
# cuda-check.sh runs every check of the CUDA build that needs no GPU (CI
# runs it; about 4 minutes on 2 cores once the toolkit is installed):
#
#  1. the CUDA 11.8 toolkit from Debian non-free (scripts/cuda-toolchain.sh;
#     root, idempotent);
#  2. the embedded PTX is fresh: kernels/cuda/gen-ptx.sh regenerates it and
#     it must equal what is committed;
#  3. the cuda-tagged build: prefill-svc, decode-svc and batonctl, go vet of
#     the cuda package with the tag;
#  4. kernels/cuda/emu/run.sh: kernels.cu's own tests, then every Go test of
#     the CUDA backend against the emulated driver (BATON_REQUIRE_CUDA=1);
#  5. TestCUDAEmulated (tests/cuda_emu_test.go): the cuda-tagged prefill and
#     decode workers serve a PD request with --device cuda on the emulated
#     driver, weights and KV pages in (emulated) device memory, golden
#     against llama.cpp; then a cuda-tagged decode-svc with --device cpu
#     where the driver library has no GPU (the toolkit's stub).
#
#	scripts/cuda-check.sh [--no-install]
#
# --no-install skips step 1 (the toolkit must then be there already).
# CUDA_INCLUDE and CUDA_LIB point at another toolkit's cuda.h and stub
# libcuda.so (default: Debian's /usr/include, /usr/lib/x86_64-linux-gnu/stubs).
set -euo pipefail
cd "$(dirname "$0")/.."
step() { printf '\n== cuda: %s\n' "$*"; }

if [[ "${1:-}" != "--no-install" ]]; then
	step "toolkit (scripts/cuda-toolchain.sh)"
	if [[ $(id -u) -ne 0 ]] && ! command -v nvcc >/dev/null 2>&1; then
		echo "cuda-check: the CUDA toolkit is missing and installing it needs root (scripts/cuda-toolchain.sh)" >&2
		exit 1
	fi
	if [[ $(id -u) -eq 0 ]]; then
		scripts/cuda-toolchain.sh
	fi
fi
inc=${CUDA_INCLUDE:-/usr/include}
lib=${CUDA_LIB:-/usr/lib/x86_64-linux-gnu/stubs}
for f in "$inc/cuda.h" "$lib/libcuda.so"; do
	[[ -f $f ]] || { echo "cuda-check: $f not found (scripts/cuda-toolchain.sh installs it)" >&2; exit 1; }
done

step "PTX is fresh (kernels/cuda/gen-ptx.sh, then compare with the committed files)"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
kernels/cuda/gen-ptx.sh "$work/ptx"
for f in kernels/cuda/ptx/*.ptx; do
	if ! cmp -s "$f" "$work/ptx/$(basename "$f")"; then
		echo "cuda-check: $f is stale: run kernels/cuda/gen-ptx.sh and commit the result" >&2
		diff "$f" "$work/ptx/$(basename "$f")" | head -n 20 >&2 || true
		exit 1
	fi
done

step "cuda-tagged build of the services and batonctl"
# The compat header must come first on the include path of the whole build
# (kernels/cuda/doc.go); NVML's deprecation warnings are noise.
export CGO_CFLAGS="${CGO_CFLAGS:--O2 -g} -Wno-deprecated-declarations -I$PWD/kernels/cuda/compat -I$inc"
export CGO_LDFLAGS="-L$lib"
go build -tags cuda -o "$work/bin/" ./prefill-svc ./decode-svc ./cmd/batonctl
go vet -tags cuda ./kernels/cuda/... ./svckit/device/...

step "CUDA backend on the emulated driver (kernels/cuda/emu/run.sh)"
CUDA_INCLUDE=$inc CUDA_LIB=$lib kernels/cuda/emu/run.sh

step "serving on the emulated GPU, and --device cpu without a GPU (TestCUDAEmulated)"
kernels/cuda/emu/run.sh --driver "$work/emu"
# A driver library that sees no GPU: the toolkit's stub answers cuInit with
# CUDA_ERROR_STUB_LIBRARY, as a machine with the library and no GPU would
# answer with CUDA_ERROR_NO_DEVICE.
mkdir -p "$work/nogpu"
ln -s "$lib/libcuda.so" "$work/nogpu/libcuda.so.1"
BATON_CUDA_BIN_DIR="$work/bin" BATON_CUDA_EMU_DIR="$work/emu" BATON_CUDA_NOGPU_DIR="$work/nogpu" \
	go test -tags e2e -count=1 -run '^TestCUDAEmulated$' -v ./tests/
