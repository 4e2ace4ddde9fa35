#!/bin/sh
# devicecheck.sh checks the CUDA backend on a GPU machine in one go, in
# about two minutes, without a Go toolchain there:
#
#  1. finds the NVIDIA driver's libcuda.so.1 and prints the GPU;
#  2. if nvcc is there, compiles kernels.cu to PTX (gen-ptx.sh) into
#     $OUT/ptx and has the tests load that instead of the embedded PTX;
#     commit $OUT/ptx/*.ptx into kernels/cuda/ptx/ afterwards;
#  3. runs the test binary (every CUDA kernel against the CPU backend) with
#     BATON_REQUIRE_CUDA=1, so that a missing GPU fails instead of skipping;
#  4. runs the benchmarks (matrix-vector products of TinyLlama-1.1B's
#     shapes, decode attention).
#
# Build the test binary where Go is, from kernels/cuda (see doc.go):
#
#	CGO_CFLAGS="-I$PWD/compat -I/path/to/cuda/include" CGO_LDFLAGS="-L/path/to/libcuda-stub" \
#	go test -c -tags cuda -o cuda.test .
#
# then copy it beside this script and run
#
#	sh kernels/cuda/devicecheck.sh [path/to/cuda.test]
#
# Logs go to $OUT (default: ./devicecheck-out): test.log, bench.log and
# ptx/. The exit status is the tests'. Optional settings: CUDA_LIBDIR (the
# directory of libcuda.so.1, when the search below misses it),
# DEVICECHECK_RUN and DEVICECHECK_BENCH (-test.run and -test.bench
# patterns; default all).
set -u
here=$(cd "$(dirname "$0")" && pwd)
bin=${1:-$here/cuda.test}
out=${OUT:-$PWD/devicecheck-out}
mkdir -p "$out"

if [ ! -f "$bin" ]; then
	echo "devicecheck: no test binary at $bin (build it with go test -c -tags cuda -o cuda.test)" >&2
	exit 2
fi
[ -x "$bin" ] || chmod +x "$bin"

# 1. The driver library: not the toolkit's link stub, which fails every
# call.
libdir=
for d in ${CUDA_LIBDIR:-} $(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 / {print $NF}' | xargs -r -n1 dirname) \
	/usr/local/nvidia/lib64 /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/local/cuda/compat /usr/lib/wsl/lib; do
	case $d in *stubs*) continue ;; esac
	if [ -e "$d/libcuda.so.1" ]; then
		libdir=$d
		break
	fi
done
if [ -z "$libdir" ]; then
	echo "devicecheck: libcuda.so.1 not found (is the NVIDIA driver installed?)" >&2
	exit 2
fi
echo "devicecheck: driver library in $libdir"
export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv 2>&1 || true

# 2. Fresh PTX from the kernels.cu beside this script.
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
	if timeout 120 sh "$here/gen-ptx.sh" "$out/ptx" >"$out/gen-ptx.log" 2>&1; then
		cat "$out/gen-ptx.log"
		export BATON_CUDA_PTX="$out/ptx/kernels_sm90.ptx"
		echo "devicecheck: tests load $BATON_CUDA_PTX"
	else
		cat "$out/gen-ptx.log"
		echo "devicecheck: gen-ptx.sh failed; the tests use the embedded PTX" >&2
	fi
else
	echo "devicecheck: no nvcc; the tests use the embedded PTX"
fi

# 3. Tests.
cd "$here"
BATON_REQUIRE_CUDA=1 timeout 150 "$bin" -test.v -test.count=1 -test.timeout=140s \
	-test.run "${DEVICECHECK_RUN:-.}" >"$out/test.log" 2>&1
status=$?
grep -E '^(--- |    --- |PASS|FAIL|ok|panic)|backend: |_test.go' "$out/test.log" | head -n 120
echo "devicecheck: tests exited with status $status"

# 4. Benchmarks.
timeout 100 "$bin" -test.run '^$' -test.bench "${DEVICECHECK_BENCH:-.}" -test.benchtime=0.5s -test.timeout=95s >"$out/bench.log" 2>&1
cat "$out/bench.log"
exit $status
