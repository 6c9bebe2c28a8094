#!/usr/bin/env bash
# The whole GPU session on one machine with two H200s (device kind nvidia-h200-x2), as four
# back-to-back device calls (a call runs at most 10 minutes; an idle machine is given back after
# 30 s, so each call follows the last at once). Each call's files come back as one archive in $OUT.
#
#   bash tests/gpu/session.sh call1   carry .whl .carry/smolA   env; flash-attn's lean build started in the
#                                                               background; tp_session.py's tests (models,
#                                                               lifecycle and NCCL tensor parallel)
#   bash tests/gpu/session.sh call2   carry .carry/smolB        notebook 04 on both GPUs (tp_session.py notebook)
#   bash tests/gpu/session.sh call3   carry .carry/smolC        GPU 0: the single-GPU gpu tests; GPU 1: notebooks
#                                                               02 and 03 (executed in place), then the flash_attn
#                                                               gpu tests
#   bash tests/gpu/session.sh call4                             GPU 0: notebooks 00, 01 and 05; GPU 1: the bench:
#                                                               minillm (triton, flash_attn), nano-vLLM and HF on
#                                                               one workload
#
# On one GPU (kind nvidia-h200) the same work runs as named steps, one after another, on GPU 0:
#   bash tests/gpu/session.sh steps NAME STEP...   STEP: prepare flash-start gpu-tests cpu-suite lifecycle
#                                                  notebooks=02,03 flash-wait flash-wheel flash-tests bench;
#                                                  the archive is $OUT/NAME.tar.gz
#
# flash-attn: build_flash_attn.sh builds it in the background (lean: 468 s with 8 jobs on the H200);
# `build_flash_attn.sh wheel` brings the built wheel back (9.5 MB), and a later session carries it in
# .whl/, where env.sh installs it with the others.
#
# SmolLM2's GGUF (98 MB) is larger than one call may carry: its parts come one per call and
# tests/gpu/env.sh reassembles it, so notebooks 00 and 01 (which run SmolLM2) wait for call 4.
# Work on the two GPUs runs side by side and shares the machine's 32 CPU cores (and, until it ends,
# the flash-attn build's jobs): GPU timings are per device, host-side overheads see the neighbour.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source tests/gpu/env.sh
OUT=${OUT:-$PWD/.out}
WORK=/tmp/session/${2:-$1}
mkdir -p "$OUT" "$WORK"
NB=notebooks
GPU_TESTS="tests --ignore=tests/test_tp.py --ignore=tests/test_lifecycle.py"  # those two: tp_session.py, the lifecycle step

stamp() { echo "[$(date -u +%T)] $*"; }
notebooks() {  # GPU LOG NOTEBOOK...: execute notebooks in place on one GPU, one after another
    local gpu=$1 log=$2; shift 2
    eval "$(bash tests/gpu/build_flash_attn.sh env 2>/dev/null)"  # flash-attn, where this session built it (03 uses it)
    CUDA_VISIBLE_DEVICES=$gpu timeout --kill-after=10 "${NOTEBOOK_LIMIT_S:-560}" \
        python3 -m minillm.course.notebooks run "$@" > "$log" 2>&1
    echo "notebooks $* on GPU $gpu: exit $?" >> "$log"
}
pack() {  # the call's logs and executed notebooks, as one archive in $OUT
    tar -czf "$OUT/$1.tar.gz" "${@:2}" -C "$WORK" . 2>/dev/null
    ls -la "$OUT"
}

case ${1:-} in
call1)
    stamp "env"; nvidia-smi -L; python3 -c "import torch; print(torch.__version__, torch.cuda.device_count())"
    MAX_JOBS=${FLASH_JOBS:-12} bash tests/gpu/build_flash_attn.sh start lean
    stamp "tp session: env models lifecycle tp"
    OUT=$WORK/tp TP_SESSION_BUDGET_S=${TP_BUDGET_S:-540} python3 tests/gpu/tp_session.py env models lifecycle tp
    stamp "tp session: exit $?"
    bash tests/gpu/build_flash_attn.sh status
    pack call1
    ;;
call2)
    stamp "tp session: notebook 04"
    OUT=$WORK/tp TP_SESSION_BUDGET_S=${TP_BUDGET_S:-540} python3 tests/gpu/tp_session.py notebook
    stamp "tp session: exit $?"
    bash tests/gpu/build_flash_attn.sh status
    pack call2 "$NB/04_tensor_parallel.ipynb"
    ;;
call3)
    stamp "gpu tests on GPU 0; notebooks 02 03, then the flash_attn gpu tests, on GPU 1"
    ( notebooks 1 "$WORK/notebooks.log" "$NB/02_decoder_layer.ipynb" "$NB/03_paged_kv_cache.ipynb"
      bash tests/gpu/build_flash_attn.sh wait 30 > "$WORK/flash_build.log" 2>&1 && \
          CUDA_VISIBLE_DEVICES=1 OUT=$WORK/flash timeout 200 bash tests/gpu/bench_session.sh env tests ) &
    CUDA_VISIBLE_DEVICES=0 timeout --kill-after=10 540 python3 -m pytest $GPU_TESTS -m gpu -k "not flash" \
        -q -rs --impl=ref -p no:cacheprovider > "$WORK/gpu_tests.log" 2>&1
    echo "gpu tests: exit $?" >> "$WORK/gpu_tests.log"
    wait
    tail -n 5 "$WORK/gpu_tests.log" "$WORK/notebooks.log" "$WORK/flash/steps.tsv"
    bash tests/gpu/build_flash_attn.sh status
    pack call3 "$NB/02_decoder_layer.ipynb" "$NB/03_paged_kv_cache.ipynb"
    ;;
call4)
    stamp "notebooks 00 01 05 on GPU 0; the bench on GPU 1"
    notebooks 0 "$WORK/notebooks.log" "$NB/00_tour.ipynb" "$NB/01_vocab_weights_runtime.ipynb" \
        "$NB/05_engine_performance.ipynb" &
    bash tests/gpu/build_flash_attn.sh status
    CUDA_VISIBLE_DEVICES=1 OUT=$WORK/bench bash tests/gpu/bench_session.sh env bench
    cp "$WORK/bench/bench.json" "$OUT/" 2>/dev/null
    wait
    tail -n 3 "$WORK/notebooks.log"
    pack call4 "$NB/00_tour.ipynb" "$NB/01_vocab_weights_runtime.ipynb" "$NB/05_engine_performance.ipynb"
    ;;
steps)
    name=$2; shift 2
    touched=()
    for step in "$@"; do
        stamp "$step"
        case $step in
        prepare)  # the models written once into the cache, so no first-use message lands in a notebook's outputs
            python3 -c "from minillm.model_zoo import resolve_model as r; print(r('qwen3-tiny'), r('qwen3-0.6b-random'))" ;;
        flash-start) MAX_JOBS=${FLASH_JOBS:-10} bash tests/gpu/build_flash_attn.sh start lean ;;
        gpu-tests)
            timeout --kill-after=10 420 python3 -m pytest $GPU_TESTS -m gpu -k "not flash" \
                -q -rs --impl=ref -p no:cacheprovider > "$WORK/gpu_tests.log" 2>&1
            echo "gpu tests: exit $?" | tee -a "$WORK/gpu_tests.log"; tail -n 4 "$WORK/gpu_tests.log" ;;
        cpu-suite)  # the CPU suite as CI runs it (kernels interpreted), here on a CUDA machine; less what this
            # machine cannot run: the browser tests (no Chromium) and SmolLM2's (its GGUF comes in parts)
            timeout --kill-after=10 ${SUITE_S:-400} python3 -m pytest tests -q -rs --impl=ref -n ${SUITE_JOBS:-8} \
                -p no:cacheprovider -k "not smollm2" --ignore tests/test_jupyterlab.py --ignore tests/test_slides.py \
                --ignore tests/test_chat_page.py > "$WORK/cpu_suite.log" 2>&1
            echo "cpu suite: exit $?" | tee -a "$WORK/cpu_suite.log"; tail -n 4 "$WORK/cpu_suite.log"
            for impl in solutions "exercises --expect-stubs"; do
                timeout --kill-after=10 200 python3 -m pytest tests/exercises -q --impl=$impl -p no:cacheprovider \
                    -n ${SUITE_JOBS:-8} >> "$WORK/exercises.log" 2>&1
                echo "exercises --impl=$impl: exit $?" | tee -a "$WORK/exercises.log"; tail -n 2 "$WORK/exercises.log"
            done ;;
        lifecycle)
            timeout --kill-after=10 200 python3 -m pytest tests/test_lifecycle.py -m gpu -v -rs --impl=ref \
                -p no:cacheprovider > "$WORK/lifecycle.log" 2>&1
            echo "lifecycle tests: exit $?" | tee -a "$WORK/lifecycle.log"; tail -n 6 "$WORK/lifecycle.log" ;;
        notebooks=*)
            paths=()
            for n in $(echo "${step#notebooks=}" | tr ',' ' '); do paths+=($NB/${n}_*.ipynb); done
            touched+=("${paths[@]}")
            notebooks 0 "$WORK/notebooks_${step#notebooks=}.log" "${paths[@]}"
            tail -n 4 "$WORK/notebooks_${step#notebooks=}.log" ;;
        flash-wait) bash tests/gpu/build_flash_attn.sh wait ${FLASH_WAIT_S:-300} | tail -n 3 ;;
        flash-wheel) bash tests/gpu/build_flash_attn.sh wheel ;;  # $OUT/flash_attn-*.whl, to carry in .whl/ next time
        flash-tests)  # flash-attn from a carried wheel (.whl/flash_attn-*.whl), or from this session's build
            python3 -c "from flash_attn import flash_attn_with_kvcache" 2>/dev/null || \
                bash tests/gpu/build_flash_attn.sh wait 20 > "$WORK/flash_build.log" 2>&1
            OUT=$WORK/flash timeout 200 bash tests/gpu/bench_session.sh env tests
            tail -n 3 "$WORK/flash/tests.log" ;;
        bench)
            OUT=$WORK/bench bash tests/gpu/bench_session.sh env bench
            cp "$WORK/bench/bench.json" "$OUT/" 2>/dev/null ;;
        *) echo "unknown step $step" >&2 ;;
        esac
    done
    bash tests/gpu/build_flash_attn.sh status
    pack "$name" "${touched[@]}"
    ;;
*)
    echo "usage: bash tests/gpu/session.sh call1|call2|call3|call4 | steps NAME STEP..." >&2; exit 64 ;;
esac
