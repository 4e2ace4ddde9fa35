#!/bin/sh
# gen-ptx.sh compiles kernels.cu to the PTX that the cuda package embeds
# (ptx/kernels_smNN.ptx, NN the lowest compute capability it runs on). Run
# it on a machine with nvcc (CUDA 11.8 to 13) whenever kernels.cu changes and
# commit the results:
#
#	kernels/cuda/gen-ptx.sh [OUTDIR]     # default OUTDIR: kernels/cuda/ptx
#
# PTX is compiled for the actual GPU by the driver when the backend starts,
# so one file serves every GPU of at least its compute capability: sm_90
# (Hopper and later), and sm_75 (Turing and later; CUDA 13's oldest) as a
# fallback, skipped with a warning where nvcc cannot target it. The driver
# must be at least as new as the nvcc that wrote the PTX (CUDA 13.0 needs
# driver 580).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/ptx}
nvcc=${NVCC:-}
if [ -z "$nvcc" ]; then
	nvcc=$(command -v nvcc || true)
	[ -n "$nvcc" ] || [ ! -x /usr/local/cuda/bin/nvcc ] || nvcc=/usr/local/cuda/bin/nvcc
fi
if [ -z "$nvcc" ]; then
	echo "gen-ptx.sh: nvcc not found (set NVCC or put it on PATH)" >&2
	exit 1
fi
mkdir -p "$out"
"$nvcc" --version | tail -n 2
# -O3 for the device code; no fast math: expf and division must stay
# within an ulp or two of the CPU's results.
"$nvcc" -ptx -O3 -arch=compute_90 -o "$out/kernels_sm90.ptx" "$here/kernels.cu"
echo "wrote $out/kernels_sm90.ptx"
if "$nvcc" -ptx -O3 -arch=compute_75 -o "$out/kernels_sm75.ptx" "$here/kernels.cu"; then
	echo "wrote $out/kernels_sm75.ptx"
else
	rm -f "$out/kernels_sm75.ptx"
	echo "gen-ptx.sh: warning: nvcc cannot target compute_75; only sm_90 PTX written" >&2
fi
