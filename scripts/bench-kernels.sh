#!/usr/bin/env bash
# Measures the engine's forward pass on the shapes of the kernel speed
# study (docs/kernels.md): pp128 and tg64 at --threads 2 and 1, as
# llama-bench measures them, with the machine's read bandwidth beside each
# 2-thread run. Given --llama-bench (once per reference engine), it runs each
# engine's llama-bench on the same GGUF files, interleaved with Baton model
# by model and thread count by thread count, so that all see the same
# machine, and prints every engine's figures and Baton's ratio to the best
# of them.
#
# Run it on a quiet machine: anything else running skews every figure.
#
# Usage: scripts/bench-kernels.sh [--models-dir DIR] [--out DIR] [-r R]
#          [--threads "2 1"] [--shapes "llama-110m-f32 tinyllama-1.1b-q8_0 tinyllama-1.1b-f16"]
#          [--llama-bench "[NAME=]PATH [ARGS...]"]...
#
#   --shapes LIST     PRESET-TYPE names: llama-110m or tinyllama-1.1b, and any
#                     type gen-model writes (e.g. tinyllama-1.1b-q5_k)
#   --models-dir DIR  where the GGUF files are, or are generated once with
#                     batonctl gen-model (default $BATON_KERNEL_MODELS, else
#                     results/kernel-models; 3.8 GB for all three)
#   --out DIR         results directory (default results/bench-kernels-DATE)
#   -r R              repetitions of each test (default 3)
#   --llama-bench S   also run a llama-bench: S is its path, optionally
#                     NAME=PATH (the engine's name in the table; default
#                     llama.cpp, then llama.cpp-2, ...), then any extra
#                     llama-bench arguments, space-separated (e.g.
#                     "ik=/ref/ik/build/bin/llama-bench -rtr 1"); repeat
#                     for each engine
set -euo pipefail
cd "$(dirname "$0")/.."

MODELS_DIR=${BATON_KERNEL_MODELS:-results/kernel-models} OUT="" REPS=3 THREADS="2 1"
ENGINES=() # "NAME=PATH ARGS...", one per --llama-bench
SHAPES="llama-110m-f32 tinyllama-1.1b-q8_0 tinyllama-1.1b-f16"
while [[ $# -gt 0 ]]; do
  case $1 in
    --models-dir) MODELS_DIR=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -r) REPS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --shapes) SHAPES=$2; shift 2 ;;
    --llama-bench) ENGINES+=("$2"); shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench-kernels: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
OUT=${OUT:-results/bench-kernels-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT" "$MODELS_DIR"
# Each engine as its name, its llama-bench and its extra arguments.
ENAMES=() EPATHS=() EARGS=()
for e in "${ENGINES[@]}"; do
  read -r first rest <<< "$e"
  name="" path=$first
  if [[ $first == *=* ]]; then name=${first%%=*} path=${first#*=}; fi
  if [[ -z $name ]]; then
    name=llama.cpp
    [[ ${#ENAMES[@]} -gt 0 ]] && name=llama.cpp-$((${#ENAMES[@]} + 1))
  fi
  if [[ ! -x $path ]]; then
    echo "bench-kernels: --llama-bench $path is not an executable" >&2; exit 2
  fi
  for n in "${ENAMES[@]}"; do
    [[ $n == "$name" ]] && { echo "bench-kernels: two engines named $name (use NAME=PATH)" >&2; exit 2; }
  done
  ENAMES+=("$name") EPATHS+=("$path") EARGS+=("${rest:-}")
done

echo "== building batonctl"
go build -o "$OUT/batonctl" ./cmd/batonctl
BATONCTL=$OUT/batonctl

model_path() { echo "$MODELS_DIR/$1.gguf"; }
for s in $SHAPES; do
  p=$(model_path "$s")
  [[ -f $p ]] && continue
  echo "== generating $p"
  # A shape is PRESET-TYPE: a gen-model preset and a storage type
  # (tinyllama-1.1b-q5_k is the 1.1B shape in Q5_K).
  preset=${s%-*} typ=${s##*-}
  case $preset in
    llama-110m | tinyllama-1.1b) "$BATONCTL" gen-model --preset "$preset" --type "$typ" --out "$p" ;;
    *) echo "bench-kernels: unknown shape $s (want llama-110m-TYPE or tinyllama-1.1b-TYPE)" >&2; exit 2 ;;
  esac
done

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with local changes)')"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ //') × $(nproc)"
  echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)"
  for i in "${!ENAMES[@]}"; do
    d=$(cd "$(dirname "${EPATHS[$i]}")" && pwd)
    c=$(cat "$d/../../COMMIT" 2>/dev/null || git -C "$d" rev-parse HEAD 2>/dev/null || echo unknown)
    echo "engine ${ENAMES[$i]}: ${EPATHS[$i]} ${EARGS[$i]} (commit $c)"
  done
} > "$OUT/machine.txt"
cat "$OUT/machine.txt"

# field FILE NAME prints the first number after "NAME": in a JSON file.
field() { { grep -o "\"$2\": *[0-9.eE+-]*" "$1" || true; } | head -1 | sed 's/.*: *//'; }
# llama_ts FILE N_PROMPT N_GEN prints llama-bench's avg_ts of the pp (n_gen 0)
# or tg (n_prompt 0) test in its JSON output.
llama_ts() {
  tr -d '\n ' < "$1" | sed 's/},{/}\n{/g' | { grep "\"n_prompt\":$2," || true; } | { grep "\"n_gen\":$3," || true; } |
    { grep -o '"avg_ts":[0-9.eE+-]*' || true; } | head -1 | cut -d: -f2
}
# num X DIGITS prints X rounded to DIGITS decimals, or - when X is empty.
num() { if [[ -n $1 ]]; then awk -v a="$1" -v d="$2" 'BEGIN { printf "%.*f", d, a }'; else echo -; fi; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }'; }

ROWS=()
for s in $SHAPES; do
  m=$(model_path "$s")
  for t in $THREADS; do
    membw=()
    [[ $t == 2 ]] && membw=(--membw)
    echo "== $s, $t thread(s): Baton"
    "$BATONCTL" bench-engine --model "$m" --threads "$t" -p 128 -n 64 -r "$REPS" --json "${membw[@]}" > "$OUT/$s-t$t.baton.json"
    bpp=$(field "$OUT/$s-t$t.baton.json" pp_tokens_per_second)
    btg=$(field "$OUT/$s-t$t.baton.json" tg_tokens_per_second)
    bw=$(field "$OUT/$s-t$t.baton.json" read_gb_per_second)
    frac=$(field "$OUT/$s-t$t.baton.json" tg_bandwidth_fraction)
    row="| $s | $t | $(num "$bpp" 1) | $(num "$btg" 1) | $(num "$bw" 1) | $(num "$frac" 2) |"
    bestpp=0 besttg=0
    for i in "${!ENAMES[@]}"; do
      n=${ENAMES[$i]}
      echo "== $s, $t thread(s): $n"
      # shellcheck disable=SC2086 # the extra arguments are split on purpose
      if "${EPATHS[$i]}" -m "$m" -t "$t" -p 128 -n 64 -r "$REPS" -o json ${EARGS[$i]} > "$OUT/$s-t$t.$n.json" 2> "$OUT/$s-t$t.$n.log"; then
        lpp=$(llama_ts "$OUT/$s-t$t.$n.json" 128 0)
        ltg=$(llama_ts "$OUT/$s-t$t.$n.json" 0 64)
      else
        echo "bench-kernels: $n failed on $s at $t thread(s); see $OUT/$s-t$t.$n.log" >&2
        lpp="" ltg=""
      fi
      row+=" $(num "$lpp" 1) | $(num "$ltg" 1) |"
      bestpp=$(awk -v a="$bestpp" -v b="${lpp:-0}" 'BEGIN { print (b > a ? b : a) }')
      besttg=$(awk -v a="$besttg" -v b="${ltg:-0}" 'BEGIN { print (b > a ? b : a) }')
    done
    if [[ ${#ENAMES[@]} -gt 0 ]]; then
      row+=" $(ratio "${bpp:-0}" "$bestpp") | $(ratio "${btg:-0}" "$besttg") |"
    fi
    ROWS+=("$row")
  done
done

{
  echo
  head="| shape | threads | Baton pp128 t/s | Baton tg64 t/s | read GB/s | tg / read bw |"
  rule="| --- | --- | --- | --- | --- | --- |"
  for n in "${ENAMES[@]}"; do
    head+=" $n pp128 | $n tg64 |"
    rule+=" --- | --- |"
  done
  if [[ ${#ENAMES[@]} -gt 0 ]]; then
    head+=" pp ratio to the best | tg ratio to the best |"
    rule+=" --- | --- |"
  fi
  echo "$head"
  echo "$rule"
  printf '%s\n' "${ROWS[@]}"
} | tee "$OUT/summary.md"
echo "== results in $OUT"
