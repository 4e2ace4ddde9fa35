#!/usr/bin/env bash
# Installs the CUDA 11.8 toolkit from Debian's non-free component: nvcc (for
# kernels/cuda/gen-ptx.sh), /usr/include/cuda.h and the driver stub
# /usr/lib/x86_64-linux-gnu/stubs/libcuda.so, which are what the cuda-tagged
# Go tests need to build and run on the emulated driver (kernels/cuda/emu).
# Idempotent: it does nothing when nvcc and cuda.h are already there.
# Needs root (apt); about 3 GB installed and a few minutes.
set -euo pipefail

if command -v nvcc >/dev/null 2>&1 && [[ -f /usr/include/cuda.h ]] &&
	[[ -f /usr/lib/x86_64-linux-gnu/stubs/libcuda.so ]]; then
	echo "cuda-toolchain: already installed ($(nvcc --version | tail -n 1))"
	exit 0
fi

src=/etc/apt/sources.list.d/debian.sources
if [[ ! -f $src ]]; then
	echo "cuda-toolchain: $src not found (expects a Debian deb822 sources file)" >&2
	exit 1
fi
# The toolkit lives in non-free; add the components once, on every stanza
# whose Components line still lacks them.
if grep -q '^Components:' "$src" && grep '^Components:' "$src" | grep -qv 'non-free'; then
	sed -i '/^Components:/{/non-free/!s/$/ contrib non-free non-free-firmware/}' "$src"
fi

export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y --no-install-recommends nvidia-cuda-toolkit
nvcc --version | tail -n 1
