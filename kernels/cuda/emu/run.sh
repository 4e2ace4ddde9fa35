#!/bin/sh
# run.sh tests the CUDA backend on the CPU, where there is no GPU:
#
#  1. builds kernels_test.cpp and runs it: kernels.cu's kernels, on the
#     emulation in cuda_fp16.h, against references of their own;
#  2. builds driver.cpp into an emulated libcuda.so.1;
#  3. builds the cuda package's test binary with -tags cuda and runs it
#     against the emulated driver with BATON_REQUIRE_CUDA=1, so every Go
#     test of the backend runs (they compare it with the CPU backend).
#
# Needs g++ with C++20 (CXX to choose another compiler), Go, and for step 3
# cuda.h and a libcuda.so to link against (the toolkit's stub will do):
#
#	CUDA_INCLUDE=/usr/local/cuda/include CUDA_LIB=/usr/local/cuda/lib64/stubs \
#	kernels/cuda/emu/run.sh [test binary flags, e.g. -test.run TestMatMul -test.v]
#
# or, with g++ alone, kernels/cuda/emu/run.sh --kernels-only (step 1).
#
# kernels/cuda/emu/run.sh --driver DIR builds the emulated driver alone into
# DIR/libcuda.so.1, for cuda-tagged binaries to run on with
# LD_LIBRARY_PATH=DIR (scripts/cuda-check.sh serves a model that way).
#
# The emulation runs a thread per CUDA thread: the whole suite takes
# minutes, and says nothing about speed.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
pkg=$(dirname "$here")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cxx=${CXX:-g++}
kernels_only=0
if [ "${1:-}" = "--driver" ]; then
  out=${2:?--driver needs a directory}
  mkdir -p "$out"
  # shellcheck disable=SC2086
  $cxx -std=c++20 -O2 -Wall -Wno-unknown-pragmas -Wno-unused-function -I"$here" -include cuda_fp16.h -pthread \
    -fPIC -shared -Wl,-soname,libcuda.so.1 -o "$out/libcuda.so.1" "$here/driver.cpp"
  exit 0
fi
if [ "${1:-}" = "--kernels-only" ]; then
  kernels_only=1
  shift
fi
set -- -test.count=1 "$@"

flags="-std=c++20 -O2 -Wall -Wno-unknown-pragmas -Wno-unused-function -I$here -include cuda_fp16.h -pthread"
# shellcheck disable=SC2086 # flags is a list
$cxx $flags -o "$work/kernels_test" "$here/kernels_test.cpp"
"$work/kernels_test"
# --kernels-only: step 1 alone, which needs nothing but g++ (CI runs it).
if [ "$kernels_only" = 1 ]; then
  exit 0
fi

# shellcheck disable=SC2086
$cxx $flags -fPIC -shared -Wl,-soname,libcuda.so.1 -o "$work/libcuda.so.1" "$here/driver.cpp"
echo "EMULATED" >"$work/emulated.ptx"
inc=${CUDA_INCLUDE:-/usr/local/cuda/include}
lib=${CUDA_LIB:-/usr/local/cuda/lib64/stubs}
cd "$pkg"
CGO_CFLAGS="-I$pkg/compat -I$inc" CGO_LDFLAGS="-L$lib" go test -c -tags cuda -o "$work/cuda.test" .
LD_LIBRARY_PATH="$work" BATON_REQUIRE_CUDA=1 BATON_CUDA_PTX="$work/emulated.ptx" "$work/cuda.test" "$@"
