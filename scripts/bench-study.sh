#!/usr/bin/env bash
# Reproduces the serving study of docs/benchmarks.md on this machine: Baton
# with 1 prefill + 1 decode worker (PD) against colocated serving (the decode
# worker computes prompts itself), on stories260K and on the 110M F32 shape,
# with the workloads of llama-server's figures in
# ../shared/golden/llamacpp-speed.md ("Serving under load") and request-rate
# sweeps with short and long prompts. Every run writes its JSON and table;
# charts overlay the configurations.
#
# Run it on a quiet machine: anything else running skews every figure.
#
# Usage: scripts/bench-study.sh [--out DIR] [--models "stories260k llama-110m"]
#          [--configs "colocated pd pd-split"] [--workloads "serve sweep-short sweep-long"]
#          [--port-base P] [--quick]
#
#   --out DIR      results directory (default results/bench-study-DATE)
#   --models       which models (default both; the 110M model is generated
#                  once into DIR/models, or taken from $BATON_STUDY_110M)
#   --configs      colocated: router --prefill local + decode-svc (2 threads)
#                  pd:        batonctl up, prefill and decode with 2 threads each
#                  pd-split:  prefill-svc and decode-svc with 1 thread each,
#                             pinned to cores 0 and 1 when taskset exists
#   --workloads    which workloads (default all three)
#   --port-base P  ports P to P+5, batonctl up's layout (default 18700)
#   --quick        a few requests per workload: checks the script, not Baton
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

OUT="" MODELS="stories260k llama-110m" CONFIGS="colocated pd pd-split" WORKLOADS="serve sweep-short sweep-long" PORT_BASE=18700 QUICK=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --out) OUT=$2; shift 2 ;;
    --models) MODELS=$2; shift 2 ;;
    --configs) CONFIGS=$2; shift 2 ;;
    --workloads) WORKLOADS=$2; shift 2 ;;
    --port-base) PORT_BASE=$2; shift 2 ;;
    --quick) QUICK=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench-study: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
OUT=${OUT:-results/bench-study-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
command -v curl >/dev/null || { echo "bench-study: curl is needed to wait for readiness" >&2; exit 1; }

BIN=$OUT/bin
echo "== building into $BIN"
go build -o "$BIN/" ./cmd/batonctl ./router-svc ./prefill-svc ./decode-svc
BATONCTL=$BIN/batonctl

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with local changes)')"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ //') × $(nproc)"
  echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)"
  echo "quick: $QUICK; models: $MODELS; configs: $CONFIGS; workloads: $WORKLOADS"
} > "$OUT/machine.txt"

model_file() {
  case $1 in
    stories260k)
      local p=$ROOT/../shared/models/stories260K.gguf
      [[ -f $p ]] || { echo "bench-study: $p missing" >&2; exit 1; }
      echo "$p" ;;
    llama-110m)
      local p=${BATON_STUDY_110M:-$OUT/models/llama-110m.gguf}
      if [[ ! -f $p ]]; then
        mkdir -p "$(dirname "$p")"
        echo "== generating the 110M F32 model into $p" >&2
        "$BATONCTL" gen-model --preset llama-110m --type f32 --out "$p" >&2
      fi
      echo "$p" ;;
    *) echo "bench-study: unknown model $1" >&2; exit 2 ;;
  esac
}

# Processes of the running configuration; stopped on any exit.
PIDS=()
stop_config() {
  local pid
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  PIDS=()
}
trap stop_config EXIT

RH=127.0.0.1:$PORT_BASE RG=127.0.0.1:$((PORT_BASE + 1))
PG=127.0.0.1:$((PORT_BASE + 2)) PH=127.0.0.1:$((PORT_BASE + 3))
DG=127.0.0.1:$((PORT_BASE + 4)) DH=127.0.0.1:$((PORT_BASE + 5))

wait_ready() { # URL LOG
  local i
  for i in $(seq 1 600); do
    curl -sf -o /dev/null "$1" && return 0
    for pid in "${PIDS[@]}"; do
      kill -0 "$pid" 2>/dev/null || { echo "bench-study: a service exited; see $2" >&2; tail -5 "$2" >&2; exit 1; }
    done
    sleep 0.2
  done
  echo "bench-study: $1 not ready after 120 s; see $2" >&2
  exit 1
}

start_config() { # CONFIG MODEL_FILE CONTEXT LOG
  local cfg=$1 model=$2 ctx=$3 log=$4 pin0="" pin1=""
  local common=(--model "$model" --log-level warn --context-length "$ctx")
  case $cfg in
    pd)
      BATON_CONTEXT_LENGTH=$ctx "$BATONCTL" up --port-base "$PORT_BASE" --model "$model" --bin-dir "$BIN" \
        --log-level warn >"$log" 2>&1 &
      PIDS+=($!) ;;
    pd-split)
      if command -v taskset >/dev/null; then pin0="taskset -c 0" pin1="taskset -c 1"; fi
      $pin0 "$BIN/prefill-svc" --grpc-addr "$PG" --http-addr "$PH" --threads 1 "${common[@]}" >>"$log" 2>&1 &
      PIDS+=($!)
      $pin1 "$BIN/decode-svc" --grpc-addr "$DG" --http-addr "$DH" --threads 1 "${common[@]}" >>"$log" 2>&1 &
      PIDS+=($!)
      "$BIN/router-svc" --grpc-addr "$RG" --http-addr "$RH" --prefill "$PG" --decode "$DG" "${common[@]}" >>"$log" 2>&1 &
      PIDS+=($!) ;;
    colocated)
      "$BIN/decode-svc" --grpc-addr "$DG" --http-addr "$DH" "${common[@]}" >>"$log" 2>&1 &
      PIDS+=($!)
      "$BIN/router-svc" --grpc-addr "$RG" --http-addr "$RH" --prefill local --decode "$DG" "${common[@]}" >>"$log" 2>&1 &
      PIDS+=($!) ;;
    *) echo "bench-study: unknown configuration $cfg" >&2; exit 2 ;;
  esac
  wait_ready "http://$RH/health/ready" "$log"
}

# Workloads: NAME|bench flags. The serve-* ones are llama-server's
# (closed loop, ignore_eos, temperature 0.8); the sweeps vary the offered
# rate with short and long prompts.
workloads() {
  local name
  all_workloads "$1" | while IFS='|' read -r name flags; do
    [[ " $WORKLOADS " == *" $name "* ]] && echo "$name|$flags"
  done
  return 0
}

all_workloads() {
  case $1:$QUICK in
    stories260k:0) cat <<'EOF'
serve|--request-rate inf --max-concurrency 1,16 --num-prompts 320 --warmup 16 --random-input-len 5 --random-output-len 64 --ignore-eos --temperature 0.8 --slo ttft:50
sweep-short|--request-rate 16,32,64,128,inf --max-concurrency 0 --num-prompts 200 --warmup 8 --random-input-len 5 --random-output-len 64 --ignore-eos --slo ttft:50,tpot:10
sweep-long|--request-rate 8,16,32,64,inf --max-concurrency 0 --num-prompts 200 --warmup 8 --random-input-len 256 --random-output-len 64 --ignore-eos --slo ttft:100,tpot:10
EOF
    ;;
    llama-110m:0) cat <<'EOF'
serve|--request-rate inf --max-concurrency 1,4,8,16 --num-prompts 32 --warmup 2 --random-input-len 128 --random-output-len 64 --ignore-eos --temperature 0.8 --slo ttft:2000,tpot:200
sweep-short|--request-rate 0.25,0.5,1,2,inf --max-concurrency 0 --num-prompts 24 --warmup 1 --random-input-len 32 --random-output-len 64 --ignore-eos --slo ttft:1000,tpot:200
sweep-long|--request-rate 0.125,0.25,0.5,1,inf --max-concurrency 0 --num-prompts 16 --warmup 1 --random-input-len 512 --random-output-len 64 --ignore-eos --slo ttft:4000,tpot:200
EOF
    ;;
    stories260k:1) cat <<'EOF'
serve|--request-rate inf --max-concurrency 1,4 --num-prompts 8 --warmup 1 --random-input-len 5 --random-output-len 16 --ignore-eos --temperature 0.8 --slo ttft:50
sweep-short|--request-rate 16,inf --num-prompts 8 --warmup 1 --random-input-len 5 --random-output-len 16 --ignore-eos --slo ttft:50,tpot:10
sweep-long|--request-rate 16,inf --num-prompts 8 --warmup 1 --random-input-len 64 --random-output-len 16 --ignore-eos --slo ttft:100,tpot:10
EOF
    ;;
    llama-110m:1) cat <<'EOF'
serve|--request-rate inf --max-concurrency 1,2 --num-prompts 2 --warmup 1 --random-input-len 16 --random-output-len 4 --ignore-eos --temperature 0.8
sweep-short|--request-rate 2,inf --num-prompts 2 --warmup 0 --random-input-len 8 --random-output-len 4 --ignore-eos --slo ttft:1000,tpot:200
EOF
    ;;
  esac
}

for model in $MODELS; do
  file=$(model_file "$model")
  ctx=512
  [[ $model == llama-110m ]] && ctx=2048
  for cfg in $CONFIGS; do
    dir=$OUT/$model/$cfg
    mkdir -p "$dir"
    echo "== $model: starting $cfg"
    start_config "$cfg" "$file" "$ctx" "$dir/services.log"
    while IFS='|' read -r name flags; do
      echo "== $model / $cfg / $name"
      # shellcheck disable=SC2086 # flags is a list of words
      "$BATONCTL" bench --router "$RG" --model "$file" --label "$cfg" --seed 1 \
        --output "$dir/$name.json" $flags | tee "$dir/$name.txt"
    done < <(workloads "$model")
    stop_config
  done
  # Overlay the configurations, one chart directory per workload.
  while IFS='|' read -r name _; do
    inputs=()
    for cfg in $CONFIGS; do inputs+=("$OUT/$model/$cfg/$name.json"); done
    (IFS=,; "$BATONCTL" bench --from-json "${inputs[*]}" --plot "$OUT/plots/$model/$name") > "$OUT/$model/$name-tables.txt"
  done < <(workloads "$model")
done

# The llama-server comparison at concurrency 16, against its best figures in
# ../shared/golden/llamacpp-speed.md (110M: 67 output tokens/s; stories260K:
# 27.8 requests/s, p99 TTFT ~1 s).
if command -v jq >/dev/null; then
  {
    echo "| model | config | concurrency | output tok/s | req/s | TTFT p99 (ms) | TPOT median (ms) | vs llama-server |"
    echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
    for model in $MODELS; do
      for cfg in $CONFIGS; do
        f=$OUT/$model/$cfg/serve.json
        [[ -f $f ]] || continue
        jq -r --arg model "$model" --arg cfg "$cfg" '.runs[] |
          [$model, $cfg, (.max_concurrency|tostring), (.output_throughput*10|round/10|tostring),
           (.request_throughput*100|round/100|tostring), (.ttft.p99_ms*10|round/10|tostring),
           (.tpot.median_ms*100|round/100|tostring),
           (if $model == "llama-110m" then ((.output_throughput/67*100|round/100|tostring) + "× of 67 tok/s")
            else ((.request_throughput/27.8*100|round/100|tostring) + "× of 27.8 req/s") end)]
          | "| " + join(" | ") + " |"' "$f"
      done
    done
  } > "$OUT/comparison.md"
  cat "$OUT/comparison.md"
fi
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)" >> "$OUT/machine.txt"
echo "== results in $OUT (JSON and tables per model/config, charts in plots/)"
