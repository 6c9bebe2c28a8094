#!/usr/bin/env bash
# Build flash-attn 2.8.3 from its PyPI source on a machine with no network (the H200), in the
# background, so that the build outlives the command that started it (back-to-back GPU calls).
#
#   bash tests/gpu/build_flash_attn.sh start [lean|full]   start the build (default lean); returns at once
#   bash tests/gpu/build_flash_attn.sh status              running / done / failed, object files built, log tail
#   bash tests/gpu/build_flash_attn.sh wait [SECONDS]      print progress every 30 s until done (exit 0),
#                                                          failed (1) or SECONDS passed (2; default 540)
#   eval "$(bash tests/gpu/build_flash_attn.sh env)"       put the built package on PYTHONPATH
#   bash tests/gpu/build_flash_attn.sh wheel               copy the built wheel to $OUT (to carry it next time)
#
# Input: the sdist at $FLASH_ATTN_SDIST (default .whl/flash_attn-2.8.3.tar.gz, 8.4 MB; on a machine
# with PyPI: pip download flash-attn==2.8.3 --no-deps --no-binary :all: --no-build-isolation -d .whl,
# with FLASH_ATTENTION_SKIP_CUDA_BUILD=TRUE set so that its metadata step needs no CUDA).
# Output, under $FLASH_ATTN_HOME (default ~/.cache/minillm-flash-attn): site/ (the installed package,
# for PYTHONPATH), dist/ (the wheel), build.log, DONE (build facts) or FAILED (exit status).
#
# Flavours. full: upstream's recipe, every kernel (forward and backward, dropout, ALiBi, softcap,
# sliding windows), about 22 minutes with 16 jobs. lean (default): the same sources with upstream's
# own FLASHATTENTION_DISABLE_{BACKWARD,DROPOUT,ALIBI,SOFTCAP,UNEVEN_K,LOCAL} switches (commented out
# in its setup.py), defined for both nvcc and the C++ compiler: inference needs none of them, and the
# kernels minillm and nano-vLLM call (causal, no dropout, head dim 128) are the same template
# instances. A lean build refuses what it left out with a RuntimeError ("This flash attention build
# does not support ..."), never a wrong answer. Measured on a CPU machine with nvcc 13.0 for sm_90:
# a lean forward or split-KV source file compiles in about 1 CPU-minute (4 GB peak), a backward one
# in 13 s, and flash_api.cpp passes g++ -fsyntax-only with them; so the 73 sources take about 55 CPU-minutes,
# an estimated 4-5 minutes with 16 jobs on the H200 machine (not yet measured there).
set -uo pipefail

SCRIPT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
REPO=$(cd "$(dirname "$SCRIPT")/../.." && pwd)
HOME_DIR=${FLASH_ATTN_HOME:-$HOME/.cache/minillm-flash-attn}
SDIST=${FLASH_ATTN_SDIST:-$REPO/.whl/flash_attn-2.8.3.tar.gz}
PY=${PYTHON:-python3}
JOBS=${MAX_JOBS:-$(nproc)}
ARCHS=${FLASH_ATTN_CUDA_ARCHS:-90}  # sm_90: the H200
NUM_SOURCES=73  # csrc/flash_attn/flash_api.cpp and 72 kernel files (setup.py's list)
LEAN_SWITCHES="BACKWARD DROPOUT ALIBI SOFTCAP UNEVEN_K LOCAL"

log_tail() { [ -f "$HOME_DIR/build.log" ] && tail -n "${1:-5}" "$HOME_DIR/build.log" | sed 's/^/    | /'; }
# in-tree build (pip >= 21.3) under src/; an older pip builds in a /tmp/pip-* copy
objects() { find "$HOME_DIR/src" /tmp -name '*.o' -path '*flash*' -newer "$HOME_DIR/started" 2>/dev/null | wc -l; }
running() { [ -f "$HOME_DIR/pid" ] && kill -0 "$(cat "$HOME_DIR/pid")" 2>/dev/null; }
elapsed() { [ -f "$HOME_DIR/started" ] && echo $(( $(date +%s) - $(cat "$HOME_DIR/started") )) || echo 0; }

state() {
    if [ -f "$HOME_DIR/DONE" ]; then echo done
    elif [ -f "$HOME_DIR/FAILED" ]; then echo failed
    elif running; then echo running
    else echo absent; fi
}

status() {
    local s; s=$(state)
    case $s in
        done) echo "flash-attn: built ($(tr '\n' ' ' < "$HOME_DIR/DONE"))" ;;
        failed) echo "flash-attn: build FAILED (exit $(cat "$HOME_DIR/FAILED")) after $(elapsed) s; log: $HOME_DIR/build.log"
                log_tail 30 ;;
        running) echo "flash-attn: building ($(cat "$HOME_DIR/flavour")), $(elapsed) s, $(objects)/$NUM_SOURCES object files"
                 log_tail 3 ;;
        absent) echo "flash-attn: no build in $HOME_DIR (start one with: $0 start)" ;;
    esac
}

# The job itself (runs detached): unpack, apply the lean switches, build a wheel, install it, import it.
build() {
    local flavour=$1 src
    set -e
    # out of the folder that started it: a later device call replaces the carried tree, and a build whose working
    # directory is gone fails at its end (os.getcwd() in torch's import: FileNotFoundError after 72 of 73 objects)
    cd "$HOME_DIR"
    rm -rf "$HOME_DIR/src" "$HOME_DIR/site" "$HOME_DIR/dist"
    mkdir -p "$HOME_DIR/src" "$HOME_DIR/site" "$HOME_DIR/dist"
    tar -xzf "$SDIST" -C "$HOME_DIR/src"
    src=$(ls -d "$HOME_DIR"/src/flash_attn-*)
    if [ "$flavour" = lean ]; then
        # uncomment upstream's switches in nvcc_flags, and give the C++ compiler (flash_api.cpp) the same
        "$PY" - "$src/setup.py" "$LEAN_SWITCHES" <<'EOF'
import sys
path, names = sys.argv[1], sys.argv[2].split()
text = open(path).read()
start = text.index("nvcc_flags = [")  # the CUDA build's list (the ROCm section has its own comments)
end = text.index("]", start)
block = text[start:end]
for name in names:
    old = f'# "-DFLASHATTENTION_DISABLE_{name}",'
    assert block.count(old) == 1, f"nvcc_flags has no single {old!r}: not flash-attn 2.8.3's setup.py?"
    block = block.replace(old, f'"-DFLASHATTENTION_DISABLE_{name}",')
text = text[:start] + block + text[end:]
old = 'compiler_c17_flag=["-O3", "-std=c++17"]'
assert text.count(old) == 1, f"setup.py has no single {old!r}"
defines = ", ".join(f'"-DFLASHATTENTION_DISABLE_{n}"' for n in names)
text = text.replace(old, f'compiler_c17_flag=["-O3", "-std=c++17", {defines}]')
open(path, "w").write(text)
print("lean: defined FLASHATTENTION_DISABLE_" + ", _".join(names) + " for nvcc and c++")
EOF
    fi
    echo "python: $("$PY" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)')"
    echo "nvcc: $(nvcc --version | tail -n 2 | head -n 1)"
    echo "building flash-attn ($flavour) for sm_$ARCHS with $JOBS jobs"
    FLASH_ATTENTION_FORCE_BUILD=TRUE FLASH_ATTN_CUDA_ARCHS=$ARCHS MAX_JOBS=$JOBS \
        "$PY" -m pip wheel --no-build-isolation --no-deps --no-index -v -w "$HOME_DIR/dist" "$src"
    "$PY" -m pip install --no-deps --no-index --target "$HOME_DIR/site" "$HOME_DIR"/dist/flash_attn-*.whl
    PYTHONPATH="$HOME_DIR/site${PYTHONPATH:+:$PYTHONPATH}" "$PY" -c \
        'import flash_attn, flash_attn_2_cuda; from flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache; print("imports:", flash_attn.__version__, flash_attn_2_cuda.__file__)'
}

start() {
    local flavour=${1:-lean}
    case $flavour in lean|full) ;; *) echo "unknown flavour $flavour: lean or full" >&2; exit 64 ;; esac
    case $(state) in
        done) status; return 0 ;;
        running) status; return 0 ;;
    esac
    [ -f "$SDIST" ] || { echo "no flash-attn sdist at $SDIST (carry .whl/flash_attn-2.8.3.tar.gz)" >&2; exit 66; }
    command -v nvcc >/dev/null || { echo "no nvcc on PATH: flash-attn cannot build here" >&2; exit 69; }
    mkdir -p "$HOME_DIR"
    rm -f "$HOME_DIR/DONE" "$HOME_DIR/FAILED"
    echo "$flavour" > "$HOME_DIR/flavour"
    date +%s > "$HOME_DIR/started"
    # setsid + nohup: a new session, so the build survives the end of the command that started it
    setsid nohup bash -c '
        bash "$0" _build "$1" > "$2/build.log" 2>&1
        rc=$?
        if [ $rc -eq 0 ]; then
            { echo "flash-attn $("$3" -c "import sys; sys.path.insert(0, \"$2/site\"); import flash_attn; print(flash_attn.__version__)")";
              echo "flavour=$1 sm_$4 jobs=$5"; echo "seconds=$(( $(date +%s) - $(cat "$2/started") ))";
              echo "finished=$(date -u +%FT%TZ)"; } > "$2/DONE"
        else
            echo $rc > "$2/FAILED"
        fi' "$SCRIPT" "$flavour" "$HOME_DIR" "$PY" "$ARCHS" "$JOBS" < /dev/null > /dev/null 2>&1 &
    echo $! > "$HOME_DIR/pid"
    echo "flash-attn: $flavour build started (pid $(cat "$HOME_DIR/pid")), log $HOME_DIR/build.log"
}

wait_build() {
    local limit=${1:-540} t0; t0=$(date +%s)
    while true; do
        case $(state) in
            done) status; return 0 ;;
            failed|absent) status; return 1 ;;
        esac
        if [ $(( $(date +%s) - t0 )) -ge "$limit" ]; then status; return 2; fi
        echo "flash-attn: $(elapsed) s, $(objects)/$NUM_SOURCES object files"
        sleep 30
    done
}

case ${1:-status} in
    start) start "${2:-lean}" ;;
    status) status ;;
    wait) wait_build "${2:-540}" ;;
    env) [ "$(state)" = done ] && echo "export PYTHONPATH=$HOME_DIR/site\${PYTHONPATH:+:\$PYTHONPATH}" \
             || echo "echo 'flash-attn is not built ($(state)); see $0 status' >&2" ;;
    wheel) [ "$(state)" = done ] || { status; exit 1; }
           mkdir -p "${OUT:?set OUT}" && cp "$HOME_DIR"/dist/flash_attn-*.whl "$OUT"/ && ls -l "$OUT"/flash_attn-*.whl ;;
    _build) build "$2" ;;
    *) sed -n '2,12p' "$SCRIPT"; exit 64 ;;
esac
