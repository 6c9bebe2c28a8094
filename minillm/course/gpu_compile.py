"""Compile an exercise's Triton kernel for a GPU, on a machine without one.

The graded tests run the kernels in Triton's interpreter, which is looser than Triton's GPU compiler:
a loop-carried variable may change type there (`acc = tl.zeros(..., dtype=tl.float16)` then
`acc += tl.dot(a, b)`, or `l = 0` then `l = l * alpha + tl.sum(p)`: the interpreter promotes, the
compiler refuses), and a kernel that passes every graded test then fails with a CompilationError in
the notebook's GPU cells. `compile_kernels` compiles kernels for a CUDA sm_90 target (an H100) the
whole way to a cubin; Triton's nvidia backend does that on a CPU (its LLVM and ptxas ship in the
triton wheel), about a second a kernel.

It runs in a subprocess with TRITON_INTERPRET=0: in a process that interprets the kernels (every CPU
test), @triton.jit gives an interpreted function, which cannot be compiled. The subprocess imports
each kernel's module by name (exercises.ch2, solutions.ch3, minillm.course.triton_primer,
mistakes_ch2, ...) and compiles it with the signatures below: the argument types and constexprs of
minillm's launchers on a GPU (tests/exercises/test_compiles.py).

    python -m minillm.course.gpu_compile < job.json     (the subprocess; see compile_kernels)
"""
from __future__ import annotations

import ast
import inspect
import json
import os
import re
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass

TARGET = ("cuda", 90, 32)  # backend, arch (compute capability 9.0: H100/H200), warp size
TARGET_NAME = "CUDA sm_90"


@dataclass(frozen=True)
class Signature:
    """One way a launcher calls a kernel on a GPU: the argument types (Triton's names: '*fp16' a pointer
    to fp16, 'i32', 'fp32'), the constexprs, and the launch options (num_warps, num_stages)."""

    label: str  # e.g. "fp16 pointers"
    types: dict
    constexprs: dict
    options: dict


def _sig(label: str, types: dict, constexprs: dict, **options) -> Signature:
    return Signature(label, types, constexprs, options)


def _ints(*names: str) -> dict:
    return {n: "i32" for n in names}


def _ptrs(dtype: str, *names: str) -> dict:
    return {n: f"*{dtype}" for n in names}


# exercise -> (kernel name, its launches): the dtypes the graded tests use (fp32, and fp16/bf16 where the
# exercise takes them), the constexprs of minillm's launcher on a GPU (default blocks, Qwen3-0.6B's shapes:
# 8 KV heads x head_dim 128, 16 query heads, hidden 1024, KV blocks of 256)
def _add(dtype):
    return _sig(f"{dtype} pointers", {**_ptrs(dtype, "x_ptr", "y_ptr", "out_ptr"), **_ints("n")}, dict(BLOCK=1024),
                num_warps=4)


def _softmax(dtype):
    return _sig(f"{dtype} pointers", {**_ptrs(dtype, "x_ptr", "out_ptr"), **_ints("n_cols", "stride_x", "stride_out")},
                dict(BLOCK_N=1024), num_warps=8)


def _gather(dtype):
    return _sig(f"{dtype} cache", {**_ptrs(dtype, "cache_ptr"), "table_ptr": "*i32", **_ptrs(dtype, "out_ptr"),
                                    **_ints("n_tokens", "n_cols", "stride_page", "stride_row", "stride_out")},
                dict(PAGE=16, BLOCK_T=8, BLOCK_D=128), num_warps=4)


def _matmul(dtype):
    return _sig(f"{dtype} pointers", {**_ptrs(dtype, "a_ptr", "b_ptr", "c_ptr"), **_ints(
        "M", "N", "K", "stride_am", "stride_ak", "stride_bk", "stride_bn", "stride_cm", "stride_cn")},
        dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64), num_warps=8, num_stages=3)


def _online(scores, values):
    return _sig(f"{scores} scores, {values} values",
                {**_ptrs(scores, "scores_ptr"), **_ptrs(values, "values_ptr", "out_ptr"),
                 **_ints("n_keys", "head_dim", "stride_s", "stride_v", "stride_out")},
                dict(BLOCK_N=64, BLOCK_D=128), num_warps=4)


def _norm(dtype, residual: bool):
    return _sig(f"{dtype} pointers, HAS_RESIDUAL={residual}",
                {**_ptrs(dtype, "x_ptr", "residual_ptr", "weight_ptr", "out_ptr", "residual_out_ptr"),
                 **_ints("n_cols", "stride_x", "stride_residual"), "eps": "fp32"},
                dict(HAS_RESIDUAL=residual, BLOCK_N=1024), num_warps=8)


def _store(dtype, slots):
    return _sig(f"{dtype} K/V, {slots} slots", {**_ptrs(dtype, "key_ptr", "value_ptr", "k_cache_ptr", "v_cache_ptr"),
                                                 "slot_ptr": f"*{slots}",
                                                 **_ints("num_tokens", "key_stride", "value_stride",
                                                         "cache_block_stride")},
                dict(ROW=1024, PAGE=256, BLOCK_T=4, BLOCK_R=1024), num_warps=4)


def _decode(dtype, direct: bool):
    return _sig(f"{dtype} q and cache, DIRECT={direct}",
                {**_ptrs(dtype, "q_ptr", "k_cache_ptr", "v_cache_ptr"), "block_tables_ptr": "*i32",
                 "context_lens_ptr": "*i32", **_ptrs(dtype, "out_ptr"), **_ptrs("fp32", "part_out_ptr", "part_lse_ptr"),
                 "qk_scale": "fp32", **_ints("num_splits", "stride_qb", "stride_qh", "stride_cb", "stride_ct",
                                             "stride_ch", "stride_bt", "stride_ob", "stride_oh")},
                dict(GROUP=2, HEAD_DIM=128, PAGE=256, BLOCK_H=16, BLOCK_D=128, BLOCK_N=128, UPCAST=False,
                     PRECISION="tf32" if dtype == "fp32" else "ieee", DIRECT=direct), num_warps=4, num_stages=2)


LAUNCHES: dict[str, tuple[str, list[Signature]]] = {
    "2.7": ("add_kernel", [_add("fp32"), _add("fp16")]),
    "2.8": ("softmax_kernel", [_softmax("fp32"), _softmax("fp16")]),
    "2.9": ("gather_pages_kernel", [_gather("fp32"), _gather("bf16")]),
    "2.10": ("matmul_kernel", [_matmul("fp32"), _matmul("fp16")]),
    "2.11": ("online_softmax_kernel", [_online("fp32", "fp32"), _online("fp32", "fp16")]),
    "2.12": ("add_rms_norm_kernel", [_norm("bf16", True), _norm("fp32", False)]),
    "3.4": ("store_kvcache_kernel", [_store("bf16", "i64"), _store("fp32", "i32")]),
    "3.5": ("paged_decode_kernel", [_decode("bf16", False), _decode("fp32", True)]),
}


# ---- the graded process's side -------------------------------------------------------------------
def python_function(kernel):
    """The plain Python function behind a @triton.jit kernel (interpreted or not), else None."""
    fn = getattr(kernel, "fn", None)
    while fn is not None and hasattr(fn, "fn"):  # (a decorator stacked on another)
        fn = fn.fn
    return fn if inspect.isfunction(fn) else None


def locate(kernel) -> dict:
    """Where a subprocess finds this kernel: its module's name, the sys.path entry it is importable from,
    its file and its name. kernel: a @triton.jit function."""
    fn = python_function(kernel)
    path = os.path.abspath(inspect.getsourcefile(fn))
    root = os.path.dirname(path)
    for _ in fn.__module__.split(".")[1:]:
        root = os.path.dirname(root)
    return dict(module=fn.__module__, root=root, file=path, name=fn.__name__)


def is_stub(kernel) -> bool:
    """True when the kernel's body, after its docstring, only raises NotImplementedError (an exercise stub)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(python_function(kernel))))
    body = tree.body[0].body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    return len(body) == 1 and isinstance(body[0], ast.Raise) and "NotImplementedError" in ast.unparse(body[0])


def compile_kernels(exercise_id: str, kernels: list, diagnose: bool = True, timeout: float = 300.0) -> list[dict]:
    """Compile kernels (each a @triton.jit function of exercise `exercise_id`) in a subprocess for TARGET,
    with each of LAUNCHES[exercise_id]'s signatures. The first kernel is the one under test; with
    `diagnose`, the others (known wrong versions) are compiled only when it fails, and only with the
    signature it failed with. -> one result per kernel compiled (see _compile_one), in order."""
    job = dict(exercise=exercise_id, kernels=[locate(k) for k in kernels], diagnose=diagnose)
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "TRITON_INTERPRET": "0",
           "PYTHONPATH": os.pathsep.join([repo, *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run([sys.executable, "-m", "minillm.course.gpu_compile"], input=json.dumps(job),
                          capture_output=True, text=True, env=env, timeout=timeout)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip() or done.stdout.strip() or "(no output)").splitlines()[-12:]
        raise RuntimeError(f"the compile subprocess (python -m minillm.course.gpu_compile) exited with "
                           f"{done.returncode}:\n" + "\n".join(tail))
    return json.loads(lines[-1])["results"]


# known causes of a kernel the interpreter runs and the compiler rejects: the compiler's words -> plain ones
LOOP_CARRIED = re.compile(r"Loop-carried variable (\w+) has initial type (.+?) but is re-assigned to (.+?) in loop")
GLOBAL = re.compile(r"Cannot access global variable (\w+)")
UNDEFINED = re.compile(r"NameError\(['\"](\w+) is not defined")


def _type_words(t: str) -> str:
    """'<['64', '64'], fp16>' -> 'fp16 [64, 64]'; 'int32' -> 'int32'."""
    m = re.fullmatch(r"<\[(.*)\], (\w+)>", t.strip())
    return f"{m.group(2)} [{m.group(1).replace(chr(39), '')}]" if m else t.strip()


def known_cause(error: str) -> str | None:
    """A plain-words diagnosis of a compiler error the interpreter does not raise, if it is a known one."""
    m = LOOP_CARRIED.search(error)
    if m:
        name, before, after = m.group(1), _type_words(m.group(2)), _type_words(m.group(3))
        return (f"`{name}` changes type in the loop: it starts as {before} and the loop makes it {after}. The "
                f"interpreter lets a variable carried through a loop change type; the GPU compiler needs one type. "
                f"Start it with the type the loop gives it: an fp32 accumulator, "
                f"acc = tl.zeros([...], dtype=tl.float32) (cast to the output's dtype only at the store), and a "
                f"float running sum, l = 0.0 or tl.full([], 0.0, tl.float32) (not l = 0, an int)")
    m = GLOBAL.search(error)
    if m:
        return (f"the kernel reads `{m.group(1)}`, a plain Python global: the interpreter reads any global, the GPU "
                f"compiler only those made with tl.constexpr(...). Use the kernel's own argument (its BLOCK "
                f"constexpr for a block size), or pass the value in as an argument")
    m = UNDEFINED.search(error)
    if m:
        return (f"`{m.group(1)}` is not defined where the kernel is compiled: a @triton.jit kernel sees its "
                f"arguments, tl.constexpr globals and other @triton.jit functions of its module")
    return None


# ---- the subprocess's side -----------------------------------------------------------------------
def _import(where: dict):
    import importlib
    if where["root"] not in sys.path:
        sys.path.insert(0, where["root"])
    mod = importlib.import_module(where["module"])
    return getattr(mod, where["name"]), mod


def _def_line(fn) -> int:
    """The file line of a function's `def` (its decorators come before it)."""
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if line.lstrip().startswith("def "))


def _error_site(error: Exception, kernel, module) -> tuple[str, int, str] | None:
    """(file, line, that line's code) of a CompilationError, in whichever @triton.jit function of the
    kernel's module it names (the kernel itself, or a helper it calls)."""
    node, src = getattr(error, "node", None), getattr(error, "src", None)
    if node is None or src is None or not hasattr(node, "lineno"):
        return None
    candidates = [kernel] + [v for v in vars(module).values() if hasattr(v, "src") and hasattr(v, "fn")]
    for jit in candidates:
        if getattr(jit, "src", None) == src:
            fn = python_function(jit)
            line = _def_line(fn) + node.lineno - 1
            path = inspect.getsourcefile(fn)
            with open(path) as f:
                code = f.read().splitlines()[line - 1].strip()
            return path, line, code
    return None


def _compile_one(jit, module, sig: Signature) -> dict:
    """Compile one kernel with one signature. -> dict(ok, signature, seconds, and on failure: error (the
    compiler's last line), kind (its exception type), file, line, code (where it points, if it does)).
    In _run's results, `signature` is the last one compiled (the failing one) and `seconds` maps each
    signature compiled to its time."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    names = jit.arg_names
    types = {n: sig.types.get(n, "constexpr" if n in sig.constexprs else None) for n in names}
    constexprs = {k: v for k, v in sig.constexprs.items() if k in names}
    # a constexpr with a default the launcher does not pass (USE_PDL=False) keeps its default
    for i, n in enumerate(names):
        if types[n] is None:
            default = jit.params[i].default if hasattr(jit, "params") else inspect.Parameter.empty
            if default is inspect.Parameter.empty:
                return dict(ok=False, signature=sig.label, seconds=0.0, kind="TypeError",
                            error=f"the kernel has an argument `{n}` that minillm's launcher does not pass")
            types[n] = "constexpr"
            constexprs[n] = default
    start = time.perf_counter()
    try:
        triton.compile(ASTSource(fn=jit, signature=types, constexprs=constexprs), target=GPUTarget(*TARGET),
                       options=dict(sig.options))
    except Exception as error:  # noqa: BLE001 - whatever the compiler raised is the finding
        text = str(error).strip()
        last = text.splitlines()[-1].strip() if text else type(error).__name__
        result = dict(ok=False, signature=sig.label, seconds=time.perf_counter() - start,
                      kind=type(error).__name__, error=last)
        site = _error_site(error, jit, module)
        if site is not None:
            result.update(file=site[0], line=site[1], code=site[2])
        return result
    return dict(ok=True, signature=sig.label, seconds=time.perf_counter() - start)


def _missing_backend() -> str | None:
    """Why Triton cannot compile for TARGET here, or None."""
    try:
        import triton
        from triton.backends import backends
    except Exception as error:  # noqa: BLE001
        return f"triton does not import: {type(error).__name__}: {error}"
    if "nvidia" not in backends:
        return (f"triton {triton.__version__} has no nvidia backend (it has: {', '.join(sorted(backends)) or 'none'}); "
                f"the check compiles for {TARGET_NAME} with it. Install the triton wheel from PyPI (it ships the "
                f"nvidia backend, its LLVM and ptxas)")
    try:  # the last stage runs ptxas (the wheel ships it): an error there would be the machine's, not the kernel's
        from triton.backends.nvidia.compiler import get_ptxas_version
    except ImportError:  # another triton's layout: the compile itself will tell
        return None
    try:
        get_ptxas_version(TARGET[1])
    except Exception as error:  # noqa: BLE001
        return (f"triton {triton.__version__}'s nvidia backend cannot run ptxas ({type(error).__name__}: {error}); "
                f"the check compiles for {TARGET_NAME} with it. Reinstall the triton wheel from PyPI, or point "
                f"TRITON_PTXAS_PATH at a CUDA toolkit's ptxas")
    return None


def _run(job: dict) -> list[dict]:
    missing = _missing_backend()
    if missing is not None:
        return [dict(ok=False, missing_backend=missing)]
    _, sigs = LAUNCHES[job["exercise"]]
    results = []
    for i, where in enumerate(job["kernels"]):
        if i > 0 and (not job["diagnose"] or results[0]["ok"]):
            break
        try:
            jit, module = _import(where)
        except Exception as error:  # noqa: BLE001
            results.append(dict(ok=False, signature="", seconds=0.0, kind=type(error).__name__,
                                error=f"{where['module']} does not import: {type(error).__name__}: {error}"))
            continue
        tried = sigs if i == 0 else [s for s in sigs if s.label == results[0].get("signature")]
        if not tried:  # the kernel under test failed before any compile (its module does not import)
            break
        seconds = {}
        for sig in tried:
            result = _compile_one(jit, module, sig)
            seconds[sig.label] = round(result["seconds"], 3)
            if not result["ok"]:
                break
        results.append({**result, "seconds": seconds})
    return results


def main() -> None:
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise SystemExit("run with TRITON_INTERPRET=0: an interpreted @triton.jit function cannot be compiled")
    print(json.dumps(dict(results=_run(json.loads(sys.stdin.read())))))


if __name__ == "__main__":
    main()
