#!/usr/bin/env bash
# Records llama.cpp's greedy outputs on random-weight files made by
# `batonctl gen-model` as golden JSON in engine/model/testdata/golden/.
#
# Usage: scripts/golden/record.sh [--list] [CASE ...]
#   CASE is ARCH_TYPE (llama_f32, qwen2_q4_k, …) or ARCH (all its types);
#   no CASE: every case below. --list prints the cases and their engines.
#
# Environment:
#   LLAMACPP_DIR     upstream llama.cpp checkout with its build in build/
#                    (default /work/ref/llama.cpp; commit c392e50 checked)
#   NEW_LLAMACPP_DIR a newer upstream llama.cpp checkout with libllama in
#                    build/bin (default /work/ref/llama.cpp-new; d32676d
#                    checked); records the architectures c392e50 lacks
#                    (qwen3, gemma3)
#   GOLDEN_NEWER_ENGINE  new (default) or ik: which engine records qwen3 and
#                    gemma3. ik (ik_llama.cpp, IK_LLAMACPP_DIR, default
#                    /work/ref/ik_llama.cpp) is kept for checks only: its CPU
#                    numerics differ from upstream ggml's (README)
#   LLAMACPP_COMMIT, NEW_LLAMACPP_COMMIT, IK_LLAMACPP_COMMIT  the engines'
#                    commits, when the checkout has no .git (else git
#                    rev-parse HEAD, else a COMMIT file in the checkout)
#   BATONCTL         a built batonctl (default: built from cmd/batonctl)
#   GOLDEN_OUT       output folder (default engine/model/testdata/golden)
#   GOLDEN_STEPS     greedy steps per prompt (default 48)
#   GOLDEN_KV_TYPE   llama.cpp's K/V cache type, f32 (default: Baton's cache
#                    is float32) or f16 (llama.cpp's own default)
#   GOLDEN_STD       weight standard deviation passed as --std (default
#                    below); GOLDEN_NO_STD=1 leaves --std out (a batonctl
#                    without it; the llama cases then use its 0.02)
#   GOLDEN_QK_STD    std of the query and key weights, passed as --qk-std
#                    (default below; empty: left out, so --std applies to
#                    them too)
#   GOLDEN_OUTPUT_STD  std of output.weight, passed as --output-std (default:
#                    empty, left out: --std)
#   GOLDEN_WORK      scratch folder for tools and model files (default: a
#                    temporary folder, removed at the end)
#
# Each JSON's "command" lists the exact commands that made it (paths
# relative to the repository root; FILE.gguf is a scratch file whose sha256
# is in "model"), and "gen_model_args" the gen-model arguments, so a test can
# regenerate the same file and check its sha256 before comparing.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"

LLAMACPP_DIR=${LLAMACPP_DIR:-/work/ref/llama.cpp}
NEW_LLAMACPP_DIR=${NEW_LLAMACPP_DIR:-/work/ref/llama.cpp-new}
IK_LLAMACPP_DIR=${IK_LLAMACPP_DIR:-/work/ref/ik_llama.cpp}
GOLDEN_NEWER_ENGINE=${GOLDEN_NEWER_ENGINE:-new}
GOLDEN_KV_TYPE=${GOLDEN_KV_TYPE:-f32}
GOLDEN_OUT=${GOLDEN_OUT:-engine/model/testdata/golden}
GOLDEN_STEPS=${GOLDEN_STEPS:-48}
GOLDEN_STD=${GOLDEN_STD:-1.0}
GOLDEN_QK_STD=${GOLDEN_QK_STD-}
GOLDEN_OUTPUT_STD=${GOLDEN_OUTPUT_STD-}
PROMPTS=scripts/golden/prompts.txt

# Shapes: rows of 256 so every K-quant fits (Q4_K/Q5_K/Q6_K need whole
# 256-blocks per row); 4 heads of 64, 2 KV heads; 2 layers; 512-token vocab.
SHAPE=(--dim 256 --hidden 512 --layers 2 --heads 4 --kv-heads 2 --vocab 512 --context 512 --seed 1)
TYPES=(F32 F16 Q8_0 Q4_K Q6_K)
ARCHS=(llama qwen2 qwen3 phi3 gemma2 gemma3)
# Shape variants, ARCH-NAME: the architecture features the base shape does
# not reach (a window that binds within the prompts, Gemma 3's global
# layer and its two rope bases, Qwen3's head_dim ≠ dim/heads), in
# VARIANT_TYPES (F32: quantized recordings depend on the machine llama.cpp
# was built on, see README.md). Their gen-model arguments come last (later
# flags win). No gemma2 variant: at this shape its random model repeats one
# token whatever the std (0.05–2, with or without --output-std), so ids
# cannot show a window bug there; gemma3-global's windows do change its ids.
declare -A VARIANTS=(
	[gemma3-global]="--layers 6 --window 16 --rope-base 1000000 --rope-base-local 10000"
	[phi3-window]="--window 16"
	[qwen3-headdim]="--head-dim 128"
)
VARIANT_TYPES=(F32)

# engine_for ARCH: which build records it (a variant, ARCH-NAME, as its ARCH) (c392e50 lacks qwen3 and gemma3,
# and its gemma2 aborts on files whose block count is not 26, 42 or 46: it
# picks the query scale by model size, not query_pre_attn_scalar).
engine_for() {
	case ${1%%-*} in
	qwen3 | gemma3 | gemma2) echo "$GOLDEN_NEWER_ENGINE" ;;
	*) echo upstream ;;
	esac
}

all_cases() {
	local a t
	for a in "${ARCHS[@]}"; do
		for t in "${TYPES[@]}"; do
			echo "${a}_$(tr 'A-Z' 'a-z' <<<"$t")"
		done
	done
	for a in $(printf '%s\n' "${!VARIANTS[@]}" | sort); do
		for t in "${VARIANT_TYPES[@]}"; do
			echo "${a}_$(tr 'A-Z' 'a-z' <<<"$t")"
		done
	done
}

if [[ ${1:-} == --list ]]; then
	for c in $(all_cases); do echo "$c $(engine_for "${c%%_*}")"; done
	exit 0
fi

# Expand the arguments into cases.
CASES=()
if (($# == 0)); then
	mapfile -t CASES < <(all_cases)
else
	for arg in "$@"; do
		m=$(all_cases | grep -E "^${arg}(_|\$)" || true)
		if [[ -z $m ]]; then
			echo "record.sh: unknown case $arg (see --list)" >&2
			exit 2
		fi
		mapfile -t -O "${#CASES[@]}" CASES <<<"$m"
	done
fi

if [[ -n ${GOLDEN_WORK:-} ]]; then
	WORK=$GOLDEN_WORK
	mkdir -p "$WORK"
else
	WORK=$(mktemp -d)
	trap 'rm -rf "$WORK"' EXIT
fi

commit_of() { # DIR VAR
	local dir=$1 override=${!2:-}
	if [[ -n $override ]]; then
		echo "$override"
	elif git -C "$dir" rev-parse HEAD 2>/dev/null; then
		:
	elif [[ -f $dir/COMMIT ]]; then
		head -1 "$dir/COMMIT"
	else
		echo unknown
	fi
}

# build_tool ENGINE: compiles llamacpp_greedy against that engine's libllama
# into $WORK/greedy-ENGINE and prints the path.
build_tool() {
	local engine=$1 dir name commit ik=0 new=0 libdirs d envdir
	case $engine in
	ik) dir=$IK_LLAMACPP_DIR name=ik_llama.cpp ik=1 envdir=IK_LLAMACPP_DIR commit=$(commit_of "$dir" IK_LLAMACPP_COMMIT) ;;
	new) dir=$NEW_LLAMACPP_DIR name=llama.cpp new=1 envdir=NEW_LLAMACPP_DIR commit=$(commit_of "$dir" NEW_LLAMACPP_COMMIT) ;;
	upstream) dir=$LLAMACPP_DIR name=llama.cpp envdir=LLAMACPP_DIR commit=$(commit_of "$dir" LLAMACPP_COMMIT) ;;
	*)
		echo "record.sh: unknown engine $engine" >&2
		return 1
		;;
	esac
	local bin=$WORK/greedy-$engine
	if [[ -x $bin ]]; then
		echo "$bin"
		return
	fi
	if [[ ! -f $dir/include/llama.h ]]; then
		echo "record.sh: $dir/include/llama.h missing: set $envdir" >&2
		return 1
	fi
	# libllama and libggml* lie in build/bin (upstream, both) or build/src and
	# build/ggml/src (ik_llama.cpp); link against wherever they are.
	libdirs=$(find "$dir/build" -name 'libllama.so' -o -name 'libggml*.so' | xargs -r -n1 dirname | sort -u)
	if [[ -z $libdirs ]]; then
		echo "record.sh: no libllama.so under $dir/build: build $name first (scripts/golden/README.md)" >&2
		return 1
	fi
	local ldflags=()
	for d in $libdirs; do ldflags+=(-L"$d" -Wl,-rpath,"$d"); done
	local ggmllibs=()
	for d in $libdirs; do
		for f in "$d"/libggml*.so; do
			[[ -e $f ]] && ggmllibs+=("-l$(basename "${f%.so}" | sed 's/^lib//')")
		done
	done
	nice -n 10 g++ -std=c++17 -O2 -Wall -I"$dir/include" -I"$dir/ggml/include" \
		-DGOLDEN_IK_API=$ik -DGOLDEN_NEW_API=$new -DGOLDEN_ENGINE="\"$name\"" -DGOLDEN_ENGINE_COMMIT="\"$commit\"" \
		scripts/golden/llamacpp_greedy.cpp -o "$bin" "${ldflags[@]}" -lllama "${ggmllibs[@]}" >&2
	echo "$bin"
}

if [[ -z ${BATONCTL:-} ]]; then
	BATONCTL=$WORK/batonctl
	nice go -C cmd/batonctl build -o "$BATONCTL" . >&2
fi
# Which of the newer gen-model flags this batonctl has (--help exits 0 or 2).
genhelp=$("$BATONCTL" gen-model --help 2>&1 || true)
have_arch=0
grep -qE -- '^ +-arch( |$)' <<<"$genhelp" && have_arch=1
have_std=0
grep -qE -- '^ +-std( |$)' <<<"$genhelp" && have_std=1
have_qk_std=0
grep -qE -- '^ +-qk-std( |$)' <<<"$genhelp" && have_qk_std=1

# show ARGS...: the command as it would be typed at the repository root.
show() {
	local out="" a
	for a in "$@"; do
		case $a in
		*/batonctl) a=batonctl ;;
		*/greedy-ik | */greedy-upstream | */greedy-new) a=llamacpp_greedy ;;
		esac
		a=${a#"$WORK/"}
		a=${a#"$ROOT/"}
		out+="${out:+ }$(printf '%q' "$a")"
	done
	echo "$out"
}

mkdir -p "$GOLDEN_OUT"
failed=()
for c in "${CASES[@]}"; do
	arch=${c%%_*} typ=${c#*_}
	typ=$(tr 'a-z' 'A-Z' <<<"$typ")
	engine=$(engine_for "$arch")
	start=$(date +%s)
	gen=("${SHAPE[@]}" --type "$typ")
	extra=()
	if [[ $arch == *-* ]]; then
		read -r -a extra <<<"${VARIANTS[$arch]}"
		arch=${arch%%-*}
	fi
	if ((have_arch)); then
		gen=(--arch "$arch" "${gen[@]}")
	elif [[ $arch != llama ]]; then
		echo "record.sh: $c: this batonctl has no --arch; skipped" >&2
		failed+=("$c")
		continue
	fi
	if [[ -z ${GOLDEN_NO_STD:-} ]]; then
		if ((!have_std)); then
			echo "record.sh: $c: this batonctl has no --std (set GOLDEN_NO_STD=1 to use its default); skipped" >&2
			failed+=("$c")
			continue
		fi
		gen+=(--std "$GOLDEN_STD")
	fi
	if [[ -n $GOLDEN_QK_STD ]]; then
		if ((!have_qk_std)); then
			echo "record.sh: $c: this batonctl has no --qk-std (set GOLDEN_QK_STD= to leave it out); skipped" >&2
			failed+=("$c")
			continue
		fi
		gen+=(--qk-std "$GOLDEN_QK_STD")
	fi
	if [[ -n $GOLDEN_OUTPUT_STD ]]; then
		gen+=(--output-std "$GOLDEN_OUTPUT_STD")
	fi
	gen+=("${extra[@]}") # last: a variant's flags win over the defaults above
	model=$WORK/$c.gguf
	if ! tool=$(build_tool "$engine"); then
		failed+=("$c")
		continue
	fi
	gencmd=("$BATONCTL" gen-model "${gen[@]}" --out "$model")
	if ! "${gencmd[@]}" >"$WORK/$c.gen.log" 2>&1; then
		echo "record.sh: $c: gen-model failed: $(tail -1 "$WORK/$c.gen.log")" >&2
		failed+=("$c")
		continue
	fi
	runcmd=("$tool" --model "$model" --prompts "$PROMPTS" --steps "$GOLDEN_STEPS" --top 2 --kv-type "$GOLDEN_KV_TYPE")
	envs="GOLDEN_STEPS=$GOLDEN_STEPS GOLDEN_KV_TYPE=$GOLDEN_KV_TYPE $([[ -n ${GOLDEN_NO_STD:-} ]] && echo GOLDEN_NO_STD=1 || echo "GOLDEN_STD=$GOLDEN_STD")"
	[[ -n $GOLDEN_QK_STD ]] && envs+=" GOLDEN_QK_STD=$GOLDEN_QK_STD"
	[[ -n $GOLDEN_OUTPUT_STD ]] && envs+=" GOLDEN_OUTPUT_STD=$GOLDEN_OUTPUT_STD"
	args=(--case "$c" --command "$envs $(show scripts/golden/record.sh "$c")" --command "$(show "${gencmd[@]}")" --command "$(show "${runcmd[@]}")")
	for a in "${gen[@]}"; do args+=(--gen-model-arg "$a"); done
	out=$GOLDEN_OUT/$c.json
	if ! nice -n 10 "${runcmd[@]}" "${args[@]}" --out "$out" 2>"$WORK/$c.run.log"; then
		echo "record.sh: $c: $(tail -1 "$WORK/$c.run.log")" >&2
		failed+=("$c")
		continue
	fi
	rm -f "$model"
	echo "$c: $out ($engine, $(($(date +%s) - start)) s)"
done
if ((${#failed[@]})); then
	echo "record.sh: not recorded: ${failed[*]}" >&2
	exit 1
fi
