# Shared by scripts/bench-serve.sh and scripts/bench-prefix.sh (sourced,
# not run): the results directory, the build, the machine's description,
# the services of one configuration and the port layout.
#
# bench_init NAME SETTINGS: NAME names the script in messages and the
# default results directory (results/NAME-DATE, unless OUT is set);
# SETTINGS is the machine.txt line of the run's settings. It sets OUT, BIN
# and BATONCTL, builds the services and batonctl into BIN, and MODEL: the
# 110M F32 file with a 2,048-token context ($BATON_BENCH_110M_2K, else
# generated into OUT/models).

bench_init() {
  BENCH_NAME=$1
  OUT=${OUT:-results/$BENCH_NAME-$(date +%Y%m%d-%H%M%S)}
  mkdir -p "$OUT"
  OUT=$(cd "$OUT" && pwd)
  command -v curl >/dev/null || { echo "$BENCH_NAME: curl is needed to wait for readiness" >&2; exit 1; }
  BIN=$OUT/bin
  echo "== building into $BIN"
  go build -o "$BIN/" ./cmd/batonctl ./router-svc ./prefill-svc ./decode-svc
  BATONCTL=$BIN/batonctl
  MODEL=${BATON_BENCH_110M_2K:-$OUT/models/llama-110m-f32-2k.gguf}
  if [[ ! -f $MODEL ]]; then
    mkdir -p "$(dirname "$MODEL")"
    "$BATONCTL" gen-model --preset llama-110m --type f32 --context 2048 --out "$MODEL"
  fi
  {
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with local changes)')"
    echo "cpu: $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ //') × $(nproc)"
    echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)"
    echo "llama-server: ${LLAMA_SERVER:-none}"
    echo "$2"
  } > "$OUT/machine.txt"
}

# bench_done notes the load average after the runs.
bench_done() {
  echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)" >> "$OUT/machine.txt"
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

# bench_ports P: the router, prefill and decode listeners and admin ports
# from P on, and llama-server's own (it cannot bind one that Baton's router
# left in TIME-WAIT).
bench_ports() {
  RH=127.0.0.1:$1 RG=127.0.0.1:$(($1 + 1))
  PG=127.0.0.1:$(($1 + 2)) PH=127.0.0.1:$(($1 + 3))
  DG=127.0.0.1:$(($1 + 4)) DH=127.0.0.1:$(($1 + 5))
  RA=127.0.0.1:$(($1 + 6)) PA=127.0.0.1:$(($1 + 7)) DA=127.0.0.1:$(($1 + 8))
  LS=127.0.0.1:$(($1 + 9))
}

wait_ready() { # URL LOG
  local i pid
  for i in $(seq 1 600); do
    curl -sf -o /dev/null "$1" && return 0
    for pid in "${PIDS[@]}"; do
      kill -0 "$pid" 2>/dev/null || { echo "$BENCH_NAME: a service exited; see $2" >&2; tail -5 "$2" >&2; exit 1; }
    done
    sleep 0.2
  done
  echo "$BENCH_NAME: $1 not ready after 120 s; see $2" >&2
  exit 1
}
