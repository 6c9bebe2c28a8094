#!/usr/bin/env bash
# Issue 18's speed check: the bench at two commits, back to back on the same GPU (one H200), so a
# refactor can show it kept the throughput (the acceptance: within 3%). Each commit runs from its own
# `git worktree` under /tmp, with the carried wheels of tests/gpu/env.sh; nothing else differs.
#
#   bash tests/gpu/bench_ab.sh BEFORE [AFTER=HEAD] [ROUNDS=2]     # revisions, or folders holding a tree
#
# Rounds alternate BEFORE, AFTER, BEFORE, AFTER, ... (a drift of the machine shows as a trend, not as
# a difference). Each run: `python -m minillm bench --json-file ... --attention-backend triton`
# (minillm alone: about a minute with the model prepared). Writes $OUT/ab/<round>-<rev>.json and
# prints each run's output tok/s, batch-1 ms/token and the AFTER/BEFORE ratio of the medians.
# $BENCH_ARGS is added to every bench command (a smaller workload: try it on a CPU first, e.g.
# BENCH_ARGS="--model qwen3-tiny --device cpu --num-seqs 2 --min-len 8 --max-input-len 16
# --max-output-len 8 --max-model-len 64 --batch1-tokens 0" PYTHON=.venv/bin/python).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source tests/gpu/env.sh >/dev/null
BEFORE=${1:?usage: bench_ab.sh BEFORE [AFTER] [ROUNDS]}
AFTER=${2:-HEAD}
ROUNDS=${3:-2}
PY=${PYTHON:-python3}
[ "${PY#/}" = "$PY" ] && [ -x "$PY" ] && PY=$PWD/$PY  # a relative interpreter path, used from the worktrees
OUT=${OUT:-$PWD/.out}/ab
mkdir -p "$OUT"
SITE_PATH=${PYTHONPATH#*:}  # env.sh put this checkout first: each run puts its own worktree there instead
# a revision gets a worktree; a folder (a tree exported beforehand, for a machine without .git) is used as it is
tree() { if [ -d "$1" ]; then (cd "$1" && pwd); else echo "/tmp/ab-$(git rev-parse --short "$1")"; fi; }
name() { if [ -d "$1" ]; then basename "$1"; else git rev-parse --short "$1"; fi; }
for rev in "$BEFORE" "$AFTER"; do
    dir=$(tree "$rev")
    [ -d "$dir" ] || git worktree add --detach "$dir" "$rev" >/dev/null
done
for round in $(seq 1 "$ROUNDS"); do
    for rev in "$BEFORE" "$AFTER"; do
        short=$(name "$rev") dir=$(tree "$rev")
        (cd "$dir" && PYTHONPATH="$dir:$SITE_PATH" timeout 280 \
            "$PY" -m minillm bench --attention-backend triton --json-file "$OUT/$round-$short.json" ${BENCH_ARGS:-} \
            > "$OUT/$round-$short.log" 2>&1) || echo "round $round $short: exit $? (see $OUT/$round-$short.log)"
    done
done
"$PY" - "$OUT" "$(name "$BEFORE")" "$(name "$AFTER")" <<'PY'
import glob, json, os, statistics, sys
out, before, after = sys.argv[1:]
runs = {before: [], after: []}
for path in sorted(glob.glob(os.path.join(out, "*-*.json"))):
    rev = os.path.basename(path)[:-5].split("-", 1)[1]
    engine = json.load(open(path))["engines"]["minillm-triton"]
    if "output_tok_s" not in engine:
        print(f"{os.path.basename(path)}: no result: {engine.get('error', engine)}")
        continue
    runs[rev].append((engine["output_tok_s"], engine.get("batch1_ms_per_token")))
    print(f"{os.path.basename(path)}: {engine['output_tok_s']:,.1f} tok/s, batch-1 {engine.get('batch1_ms_per_token')} ms")
if runs[before] and runs[after]:
    b, a = (statistics.median(t for t, _ in runs[r]) for r in (before, after))
    print(f"median {after} / {before}: {a / b:.4f} (output tok/s {a:,.1f} / {b:,.1f})")
PY
