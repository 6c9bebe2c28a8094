#!/usr/bin/env bash
# serve's and bench serve's vLLM flags on one GPU, in one short device call (carry .whl):
#     OUT=$OUT bash tests/gpu/serve_flags.sh
# `python -m minillm serve` on CUDA with two served names, a chat template file, a response role and no
# access log; one chat request (its role, model and prompt tokens checked); then `bench serve` against it
# with --max-concurrency and --burstiness; then SIGTERM: the exit status and no process left on the GPU.
# Writes serve.log, chat.json, bench_serve.json, bench_serve.log and checks.txt under $OUT.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
[ -n "${NO_GPU_ENV:-}" ] || source tests/gpu/env.sh  # NO_GPU_ENV=1: a dry run on a CPU machine (python3 = a venv)
OUT=${OUT:-$PWD/.out}
MODEL=${MODEL:-qwen3-0.6b-random}
BENCH_LENS=${BENCH_LENS:-}  # e.g. "--min-len 4 --max-input-len 32 --max-output-len 8" for the dry run
mkdir -p "$OUT"
PORT=8123
TEMPLATE=/tmp/minillm-chat-template.jinja
check() { echo "$*" | tee -a "$OUT/checks.txt"; }

python3 -c "from minillm.model_zoo import resolve_model as r; r('$MODEL')" > /dev/null
printf '%s' '{% for m in messages %}[{{ m.role }}] {{ m.content }}
{% endfor %}[answer]' > "$TEMPLATE"
python3 -m minillm serve "$MODEL" --port $PORT --max-model-len 2048 --served-model-name a b \
    --chat-template "$TEMPLATE" --response-role narrator --disable-uvicorn-access-log > "$OUT/serve.log" 2>&1 &
pid=$!
for _ in $(seq 120); do curl -sf "http://127.0.0.1:$PORT/health" > /dev/null && break; sleep 1; done
curl -s "http://127.0.0.1:$PORT/v1/chat/completions" -H 'Content-Type: application/json' \
    -d '{"model": "b", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}' > "$OUT/chat.json"
python3 - "$OUT/chat.json" "$TEMPLATE" "$MODEL" <<'EOF' | tee -a "$OUT/checks.txt"
import json, sys
from minillm.model_zoo import resolve_model
from minillm.tokenizer import Tokenizer
answer = json.load(open(sys.argv[1]))
tok = Tokenizer(resolve_model(sys.argv[3]))
want = len(tok.encode_chat([{"role": "user", "content": "Hi"}], chat_template=open(sys.argv[2]).read()))
print("chat: model", answer["model"], "| role", answer["choices"][0]["message"]["role"],
      "| prompt tokens", answer["usage"]["prompt_tokens"], "expected", want)
EOF
python3 -m minillm bench serve --port $PORT --model b --num-prompts 64 --request-rate 16 --max-concurrency 8 \
    --burstiness 0.5 $BENCH_LENS --json-file "$OUT/bench_serve.json" > "$OUT/bench_serve.log" 2>&1
check "bench serve: exit $?"
kill -TERM $pid
wait $pid
check "serve after SIGTERM: exit $?"
check "access-log lines: $(grep -c '"POST /v1' "$OUT/serve.log")"
command -v nvidia-smi > /dev/null && \
    check "processes on the GPU after it: $(nvidia-smi --query-compute-apps=pid --format=csv,noheader | wc -l)"
