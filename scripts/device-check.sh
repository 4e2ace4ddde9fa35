#!/usr/bin/env bash
# device-check.sh is the one prepared run on a GPU machine (docs/gpu.md).
# Time on such machines is short: build everything where Go is, carry it,
# run this once there, read $OUT/summary.txt.
#
# Where Go is (this repository, the CUDA toolkit installed:
# scripts/cuda-toolchain.sh):
#
#	scripts/device-check.sh --build       # writes bin/device.tar.gz (about 2 min)
#
# bin/device.tar.gz (about 38 MB, under the 64 MiB a device run may carry)
# unpacks into bin/device/, which holds the cuda-tagged prefill-svc, decode-svc, router-svc and
# batonctl, the CUDA backend's test binary, stories260K.gguf and its llama.cpp
# golden outputs (copied from ../shared; bin/ is ignored by git). Then, on
# the GPU machine, from the repository root, with no Go there:
#
#	scripts/device-check.sh               # OUT=dir for the logs (default ./device-check-out)
#
# It runs, each step bounded and logged, the summary written as it goes:
#  1. kernels/cuda/devicecheck.sh: every CUDA kernel against the CPU
#     backend, and the kernel benchmarks;
#  2. batonctl run --device cuda on stories260K, greedy, each golden prompt
#     token-exact against llama.cpp;
#  3. bench-engine --device cuda on generated 110M F32 and 1.1B Q8_0 and F16
#     files (batonctl gen-model, random weights at real shapes);
#  4. prefill-svc and decode-svc both on GPU 0, a router over them: the golden
#     prompts through PD, batonctl bench at concurrency 1, 16 and 64;
#  5. a cancel storm on them (batonctl bench --cancel-fraction: 500 requests,
#     three quarters cancelled at random moments), then 0 KV pages used or
#     leaked on both workers.
# Step 1's benchmarks include the KV copies a transfer makes
# (BenchmarkKVCopy: export, import and device-to-device, in GB/s).
#
# For a trial of the script itself where there is no GPU:
# DEVICE_CHECK_QUICK=1 benchmarks a tiny-llama file instead of the real
# shapes, DEVICE_CHECK_DEVICE=cpu (default cuda) runs steps 2-4 on the CPU.
set -uo pipefail
cd "$(dirname "$0")/.."
dev=bin/device

if [[ "${1:-}" == "--build" ]]; then
	set -e
	inc=${CUDA_INCLUDE:-/usr/include}
	lib=${CUDA_LIB:-/usr/lib/x86_64-linux-gnu/stubs}
	export CGO_CFLAGS="${CGO_CFLAGS:--O2 -g} -Wno-deprecated-declarations -I$PWD/kernels/cuda/compat -I$inc"
	export CGO_LDFLAGS="-L$lib"
	rm -rf "$dev" && mkdir -p "$dev"
	go build -tags cuda -trimpath -ldflags=-s -o "$dev/" ./prefill-svc ./decode-svc ./router-svc ./cmd/batonctl
	(cd kernels/cuda && go test -c -tags cuda -trimpath -ldflags=-s -o "../../$dev/cuda.test" .)
	cp ../shared/models/stories260K.gguf ../shared/golden/stories260K.json "$dev/"
	tar -C bin -czf bin/device.tar.gz device
	ls -la bin/device.tar.gz
	echo "carry bin/device.tar.gz to the GPU machine; run scripts/device-check.sh there"
	exit 0
fi

if [[ -f bin/device.tar.gz && ! -x $dev/batonctl ]]; then
	tar -C bin -xzf bin/device.tar.gz
fi

out=${OUT:-$PWD/device-check-out}
device=${DEVICE_CHECK_DEVICE:-cuda}
mkdir -p "$out"
summary=$out/summary.txt
: >"$summary"
say() { echo "$*" | tee -a "$summary"; }
for f in batonctl prefill-svc decode-svc router-svc cuda.test stories260K.gguf stories260K.json; do
	[[ -e $dev/$f ]] || { say "device-check: $dev/$f missing: run scripts/device-check.sh --build where Go is"; exit 2; }
done
# The driver's library (not the toolkit's stub), as devicecheck.sh finds it.
if [[ -n ${CUDA_LIBDIR:-} ]]; then
	export LD_LIBRARY_PATH=$CUDA_LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
say "device-check $(date -u +%FT%TZ) on $(hostname)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /' | tee -a "$summary"

step() { say ""; say "== $*"; }

step "1. kernels (kernels/cuda/devicecheck.sh)"
OUT=$out/kernels timeout 300 sh kernels/cuda/devicecheck.sh "$PWD/$dev/cuda.test" >"$out/kernels.log" 2>&1
say "kernel tests exit $?; $(grep -c '^--- PASS' "$out/kernels/test.log" 2>/dev/null) passed, $(grep -c '^--- FAIL' "$out/kernels/test.log" 2>/dev/null) failed"
grep -E '^Benchmark' "$out/kernels/bench.log" 2>/dev/null | head -n 20 | tee -a "$summary"

step "2. batonctl run --device $device, greedy, against llama.cpp (stories260K)"
python3 - "$dev" "$out" "$device" <<'EOF' 2>&1 | tee -a "$summary"
import json, subprocess, sys
dev, out = sys.argv[1], sys.argv[2]
g = json.load(open(f"{dev}/stories260K.json"))
ok = 0
for gen in g["generations"]:
    n = len(gen["generated_ids"])
    p = subprocess.run([f"{dev}/batonctl", "run", "--model", f"{dev}/stories260K.gguf", "--device", sys.argv[3],
                        "--prompt", gen["prompt"], "-n", str(n), "--temperature", "0", "--json"],
                       capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        print(f"  {gen['prompt']!r}: exit {p.returncode}: {p.stderr.strip()[-300:]}")
        continue
    r = json.loads(p.stdout)
    same = r["generated_ids"] == gen["generated_ids"]
    ok += same
    first = next((i for i, (a, b) in enumerate(zip(r["generated_ids"], gen["generated_ids"])) if a != b), None)
    print(f"  {gen['prompt']!r}: {'token-exact' if same else f'differs from step {first}'} on {r['device']}, "
          f"{r['prompt_tokens_per_second']:.0f} prompt tok/s, {r['generation_tokens_per_second']:.0f} tok/s")
print(f"golden: {ok} of {len(g['generations'])} token-exact")
EOF

step "3. bench-engine --device $device"
shapes="llama-110m:f32 tinyllama-1.1b:q8_0 tinyllama-1.1b:f16" pp=512 tg=128
[[ ${DEVICE_CHECK_QUICK:-} == 1 ]] && shapes="tiny-llama:f32" pp=64 tg=32
for s in $shapes; do
	preset=${s%%:*} typ=${s##*:} f=$out/$preset-$typ.gguf
	timeout 300 "$dev/batonctl" gen-model --preset "$preset" --type "$typ" --out "$f" >"$out/gen-$preset-$typ.log" 2>&1 ||
		{ say "$preset $typ: gen-model failed (see gen-$preset-$typ.log)"; continue; }
	timeout 300 "$dev/batonctl" bench-engine --model "$f" --device "$device" -p "$pp" -n "$tg" -r 3 --json >"$out/bench-$preset-$typ.json" 2>"$out/bench-$preset-$typ.log"
	say "$preset $typ: exit $? $(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print("pp %.0f tok/s, tg %.1f tok/s = %.0f GB/s of weights, on %s" % (r["pp_tokens_per_second"], r["tg_tokens_per_second"], r["tg_gb_per_second"], r["device"]))' "$out/bench-$preset-$typ.json" 2>/dev/null)"
	rm -f "$f"
done

step "4. PD on one GPU: golden, batonctl bench, pages back"
m=$dev/stories260K.gguf
common=(--model "$m" --log-level warn --shutdown-timeout 5s)
"$dev/prefill-svc" "${common[@]}" --device "$device" --grpc-addr 127.0.0.1:18181 --http-addr 127.0.0.1:18182 --admin-addr 127.0.0.1:18183 --kv-cache-bytes 2GiB >"$out/prefill.log" 2>&1 &
pf=$!
"$dev/decode-svc" "${common[@]}" --device "$device" --grpc-addr 127.0.0.1:18184 --http-addr 127.0.0.1:18185 --admin-addr 127.0.0.1:18186 --kv-cache-bytes 2GiB >"$out/decode.log" 2>&1 &
dc=$!
"$dev/router-svc" "${common[@]}" --prefill 127.0.0.1:18181 --decode 127.0.0.1:18184 --grpc-addr 127.0.0.1:18187 --http-addr 127.0.0.1:18188 --admin-addr 127.0.0.1:18189 >"$out/router.log" 2>&1 &
rt=$!
trap 'kill $pf $dc $rt 2>/dev/null' EXIT
for _ in $(seq 120); do
	curl -sf http://127.0.0.1:18188/health/ready >/dev/null 2>&1 && break
	sleep 1
done
curl -s http://127.0.0.1:18189/debug/workers >"$out/debug-workers.json" 2>/dev/null
python3 -c 'import json,sys; v=json.load(open(sys.argv[1])); [print("  ", w["role"], w["address"], w.get("device","?")) for s in ("prefill","decode") for w in (v.get(s) or {}).get("workers",[])]' "$out/debug-workers.json" 2>&1 | tee -a "$summary"
python3 - "$dev" <<'EOF' 2>&1 | tee -a "$summary"
import json, sys, urllib.request
g = json.load(open(f"{sys.argv[1]}/stories260K.json"))
# The API refuses an empty prompt (llama.cpp's empty case starts from BOS alone).
gens = [gen for gen in g["generations"] if gen["prompt"]]
ok = 0
for gen in gens:
    body = json.dumps({"model": "stories260K", "prompt": gen["prompt"], "max_tokens": len(gen["generated_ids"]), "temperature": 0}).encode()
    req = urllib.request.Request("http://127.0.0.1:18188/v1/completions", body, {"Content-Type": "application/json"})
    try:
        text = json.load(urllib.request.urlopen(req, timeout=60))["choices"][0]["text"]
    except Exception as e:
        print(f"  {gen['prompt']!r} through PD: {e}")
        continue
    ok += text == gen["generated_text"]
    if text != gen["generated_text"]:
        print(f"  {gen['prompt']!r} through PD: {text!r}, want {gen['generated_text']!r}")
print(f"golden through PD: {ok} of {len(gens)} texts equal llama.cpp's")
EOF
for c in 1 16 64; do
	timeout 240 "$dev/batonctl" bench --router 127.0.0.1:18187 --model "$m" --num-prompts $((c * 8)) --request-rate inf --max-concurrency "$c" \
		--random-input-len 64 --random-output-len 32 --json >"$out/bench-c$c.json" 2>"$out/bench-c$c.log"
	say "batonctl bench concurrency $c: exit $? $(python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["runs"][0]; print({k: r[k] for k in ("completed","failed","request_throughput","output_throughput") if k in r})' "$out/bench-c$c.json" 2>/dev/null)"
done

step "5. cancel storm: 500 requests at concurrency 64, three quarters cancelled at random moments, then every page back"
# Cancels fall over two lives of a request at this load (concurrency 64's
# median E2E above), so that they land in routing, the prefill queue, the
# prompt, the KV transfer and decode alike.
within=$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["runs"][0]; print("%dms" % max(50, 2*r["e2e"]["median_ms"]))' "$out/bench-c64.json" 2>/dev/null || echo 2s)
timeout 300 "$dev/batonctl" bench --router 127.0.0.1:18187 --model "$m" --num-prompts 500 --request-rate inf --max-concurrency 64 \
	--random-input-len 64 --random-output-len 64 --ignore-eos --cancel-fraction 0.75 --cancel-within "$within" --seed 7 \
	--json >"$out/storm.json" 2>"$out/storm.log"
say "storm (cancels within $within): exit $? $(python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["runs"][0]; print({k: r[k] for k in ("completed","failed","cancelled","errors") if k in r})' "$out/storm.json" 2>/dev/null)"
# Pages come back as each cancel reaches the workers; give them 30 s.
used() { curl -s "http://$1/metrics" | awk '/^baton_kv_pages_used / {print $2}'; }
for _ in $(seq 30); do
	[[ "$(used 127.0.0.1:18182)" == 0 && "$(used 127.0.0.1:18185)" == 0 ]] && break
	sleep 1
done
for a in 127.0.0.1:18182 127.0.0.1:18185; do
	say "  $a: $(curl -s http://$a/metrics | grep -E '^baton_kv_pages_(used|leaked) |^baton_device_memory_bytes' | tr '\n' ' ')"
done
say ""
say "logs in $out"
