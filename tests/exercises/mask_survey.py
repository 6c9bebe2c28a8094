"""Each Triton exercise's loads without their masks: does the exercise's graded test fail?

For every `tl.load(..., mask=..., other=...)` in the solution of each Triton kernel exercise, this writes
the solution with that one load's mask and other removed as the student's exercises/chN.py in a copy of
the repository, and runs the exercise's graded tests there. A load whose reads land only in guard
regions (inside the same storage) would pass; the tests with tensors of their own, under the bounds
check (minillm/course/kernel_bounds.py), make each one fail. A maintainer's tool (about 3 minutes on two
cores), not part of `make test`:

    python tests/exercises/mask_survey.py        # one line per load: CAUGHT or PASSES; exit 1 on a PASSES
"""
import ast
import os
import re
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KERNELS = {"add_kernel": (2, "ex2_7"), "softmax_kernel": (2, "ex2_8"), "gather_pages_kernel": (2, "ex2_9"),
           "matmul_kernel": (2, "ex2_10"), "online_softmax_kernel": (2, "ex2_11"),
           "add_rms_norm_kernel": (2, "ex2_12"), "store_kvcache_kernel": (3, "ex3_4"),
           "paged_decode_kernel": (3, "ex3_5")}


def masked_loads(source: str, kernel: str) -> list[ast.Call]:
    """The tl.load calls of `kernel` in a module's source that pass mask= (its docstring is not code)."""
    fn = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef) and n.name == kernel)
    return [n for n in ast.walk(fn) if isinstance(n, ast.Call) and ast.unparse(n.func) == "tl.load"
            and any(k.arg == "mask" for k in n.keywords)]


def without_mask(source: str, call: ast.Call) -> str:
    """source with that call's mask= and other= removed."""
    lines = source.splitlines(keepends=True)
    start = sum(len(x) for x in lines[:call.lineno - 1]) + call.col_offset
    end = sum(len(x) for x in lines[:call.end_lineno - 1]) + call.end_col_offset
    bare = ast.Call(func=call.func, args=call.args, keywords=[k for k in call.keywords if k.arg not in ("mask", "other")])
    return source[:start] + ast.unparse(bare) + source[end:]


def main() -> int:
    survived = 0
    with tempfile.TemporaryDirectory(prefix="mask-survey-") as root:
        tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
        for rel in filter(None, tracked.decode().split("\0")):
            os.makedirs(os.path.join(root, os.path.dirname(rel)), exist_ok=True)
            shutil.copy2(os.path.join(REPO, rel), os.path.join(root, rel))
        env = {**os.environ, "PYTHONPATH": root, "OMP_NUM_THREADS": "1"}
        for kernel, (chapter, marker) in KERNELS.items():
            solution = open(os.path.join(REPO, "solutions", f"ch{chapter}.py")).read()
            for call in masked_loads(solution, kernel):
                with open(os.path.join(root, "exercises", f"ch{chapter}.py"), "w") as f:
                    f.write(without_mask(solution, call))
                run = subprocess.run([sys.executable, "-m", "pytest", "tests/exercises", "-m", marker, "-q", "-x",
                                      "-p", "no:cacheprovider"], cwd=root, env=env, capture_output=True, text=True,
                                     check=False)
                caught = run.returncode != 0
                survived += not caught
                how = " (the bounds check)" if "KernelOutOfBounds" in run.stdout else ""
                load = re.sub(r"\s+", " ", ast.unparse(call))[:60]
                print(f"{marker[2:].replace('_', '.'):5} {kernel:22} line {call.lineno:4} {load:60} "
                      f"{'CAUGHT' if caught else 'PASSES'}{how}", flush=True)
            shutil.copy2(os.path.join(REPO, "exercises", f"ch{chapter}.py"),
                         os.path.join(root, "exercises", f"ch{chapter}.py"))
    print(f"{survived} unmasked load(s) pass their exercise's graded tests")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
