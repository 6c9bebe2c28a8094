#!/usr/bin/env bash
# Issue 20's serving figures on one GPU, in one call: `python -m minillm serve` on qwen3-0.6b-random,
# `python -m minillm bench serve` (Poisson arrivals, nano-vLLM's workload) from 1 request/s to all at
# once with the default --stream-interval 1, the half-saturation rate and the burst again with
# --stream-interval 8, the burst with the engine in the server's own process (--engine-core thread:
# what the engine process buys), then the offline `python -m minillm bench` on the same workload for
# the ratio. After each server stops, the GPU's compute processes are listed (none may be left).
#
#   source tests/gpu/env.sh; OUT=/some/dir bash tests/gpu/serve_sweep.sh     # about 5 minutes on one H200
#
# Writes $OUT/serve_si1_low.json, serve_si1_high.json, serve_si8.json, serve_thread.json (bench
# serve's JSON), offline.json (the bench's), each server's log and gpu_after_stop.txt. The README's
# H200 serving table comes from it.
set -u
OUT=${OUT:?set OUT to a folder for the results}
PORT=${PORT:-8123}
start() {  # $1: a tag for the log; the rest: serve's extra flags
  local tag=$1; shift
  python -m minillm serve --model qwen3-0.6b-random --port "$PORT" --max-model-len 4096 "$@" \
      > "$OUT/server_$tag.log" 2>&1 &
  SERVER=$!
  for _ in $(seq 180); do curl -sf "localhost:$PORT/health" >/dev/null && return; sleep 1; done
  echo "the server did not answer /health in 180 s; its log:" >&2; tail -20 "$OUT/server_$tag.log" >&2; exit 1
}
stop() {  # SIGTERM, as a process manager would; then what is left on the GPU
  kill -TERM "$SERVER"; wait "$SERVER"; echo "server exit status $?" >> "$OUT/gpu_after_stop.txt"
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv >> "$OUT/gpu_after_stop.txt" 2>&1
}
bench_serve() { timeout 300 python -m minillm bench serve --base-url "http://127.0.0.1:$PORT" "$@" 2>&1 | grep -v '^\[bench'; }

start si1
bench_serve --num-prompts 32 --request-rate 1 2 4 --json-file "$OUT/serve_si1_low.json"
bench_serve --num-prompts 256 --request-rate 8 12 16 32 inf --json-file "$OUT/serve_si1_high.json"
stop
start si8 --stream-interval 8
bench_serve --num-prompts 256 --request-rate 12 inf --json-file "$OUT/serve_si8.json"
stop
start thread --engine-core thread
bench_serve --num-prompts 256 --request-rate inf --json-file "$OUT/serve_thread.json"
stop
timeout 300 python -m minillm bench --json-file "$OUT/offline.json" 2>&1 | grep -v Generating | tail -3
