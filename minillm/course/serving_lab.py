"""Notebook 06's laboratory: `python -m minillm serve` started and stopped as a subprocess, and its
/metrics read, once or sampled during a load run. Course material (notebooks/06_serving.ipynb), not
engine code: the engine and the server never import it.

    with Server("qwen3-tiny", "--max-num-seqs", "8") as srv:   # returns once GET /health answers 200
        httpx.post(srv.url + "/v1/completions", json={...})
        read_metrics(srv.url)["minillm_kv_cache_free_blocks"]
    # leaving the block stops it: SIGTERM (uvicorn's graceful shutdown, then the engine is freed),
    # a bounded wait, SIGKILL if it is stuck. Every wait here has a timeout: nothing hangs.

The server's output goes to a log file (a pipe nobody reads would fill and block it); a server that
exits or does not answer in time raises an error that quotes the log's end. stop() keeps the log's text
(log_tail reads it after the stop too) and deletes the file, so a notebook run leaves no file behind. A
server is also stopped when the notebook's kernel exits (atexit, and on Linux the kernel's death signals
it), so a failed cell cannot leave one holding the GPU.

use_my_code=True starts the server through `swap_in("exercises", chapters={6})`, so the chapter's
exercises written in exercises/ch6.py run inside the server process too (its SSE framing, the
detokenizer, the admission bookkeeping), as `use_my_code` makes them run inside the notebook.
"""
from __future__ import annotations

import asyncio
import atexit
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

START_TIMEOUT_S = 600.0  # the first start on a GPU may prepare the model (qwen3-0.6b-random: about a minute)
STOP_TIMEOUT_S = 30.0
POLL_S = 0.1
LOG_TAIL_LINES = 15
# the server process when the notebook runs the reader's chapter-6 exercises
_SWAPPED_MAIN = ("import sys; from minillm.course.exercises import swap_in; swap_in('exercises', chapters={6}); "
                 "from minillm.cli import main; main(sys.argv[1:])")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that nothing listens on now (the server binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:  # pragma: no cover -- runs in the child between fork and exec
    """Linux: the server gets SIGTERM when the process that started it (the notebook's kernel) dies."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class Server:
    """One `python -m minillm serve --model MODEL FLAGS...` subprocess on a free local port.

    url: http://127.0.0.1:PORT (the OpenAI API is under url + "/v1"); model: the name it serves;
    flags: the serve arguments after --model (strings); start() waits for /health, stop() ends it.
    """

    def __init__(self, model: str, *flags: str, use_my_code: bool = False, start_timeout_s: float = START_TIMEOUT_S):
        self.model, self.flags, self.use_my_code = model, [str(f) for f in flags], use_my_code
        self.start_timeout_s = start_timeout_s
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.log_path = ""
        self.log_text: str | None = None  # the whole log, kept by stop() when it deletes the file
        self.start_seconds = float("nan")  # from launching the process to /health answering

    @property
    def command(self) -> list[str]:
        args = ["serve", "--model", self.model, "--port", str(self.port), *self.flags]
        if self.use_my_code:  # one process, so the swapped-in code is the code the engine runs
            return [sys.executable, "-c", _SWAPPED_MAIN, *args, "--engine-core", "thread"]
        return [sys.executable, "-m", "minillm", *args]

    def start(self) -> "Server":
        import httpx
        fd, self.log_path = tempfile.mkstemp(prefix="minillm-serve-", suffix=".log")
        self.log_text = None
        t0 = time.perf_counter()
        with os.fdopen(fd, "w") as log:
            self.proc = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        atexit.register(self.stop)
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            if self.proc.poll() is not None:
                self.stop()
                raise RuntimeError(f"the server exited with status {self.proc.returncode} before it answered:\n"
                                   f"{self.log_tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=2.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass  # not listening yet, or still loading the model (the connection waits in the backlog)
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"the server did not answer /health within {self.start_timeout_s:.0f} s:\n"
                                   f"{self.log_tail()}")
            time.sleep(POLL_S)
        self.start_seconds = time.perf_counter() - t0
        return self

    def stop(self) -> int | None:
        """Terminate the server and wait for it (SIGKILL after STOP_TIMEOUT_S), then move its log into
        log_text and delete the file. -> its exit status."""
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(STOP_TIMEOUT_S)
        atexit.unregister(self.stop)
        if self.log_text is None:
            self.log_text = self._read_log()
            if self.log_text is not None:
                os.remove(self.log_path)
        return proc.returncode

    def _read_log(self) -> str | None:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return None

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last `lines` lines of the server's output, while it runs or after stop()."""
        text = self.log_text if self.log_text is not None else self._read_log()
        if text is None:
            return "(no log)"
        return "".join(text.splitlines(keepends=True)[-lines:])

    def __enter__(self) -> "Server":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "not started" if self.proc is None else ("running" if self.proc.poll() is None else "stopped")
        return f"Server({self.model!r} {' '.join(self.flags)} at {self.url}, {state})"


# ---- /metrics ----------------------------------------------------------------------------------------
def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus' text format -> {sample name with its labels, as written: value}; comments skipped."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def read_metrics(url: str, timeout_s: float = 10.0) -> dict[str, float]:
    """GET url/metrics, parsed (parse_metrics)."""
    import httpx
    return parse_metrics(httpx.get(url + "/metrics", timeout=timeout_s).text)


async def sample_in_system(client, url: str, stop: asyncio.Event, period_s: float = 0.05) -> list[tuple]:
    """Until `stop` is set: every period_s, the server's own count of its requests.
    -> [(time.perf_counter(), running, waiting), ...] (running: started and not finished; waiting:
    accepted, no step run yet). Run it beside a load (asyncio.gather); a failed read is skipped."""
    samples = []
    while not stop.is_set():
        try:
            m = parse_metrics((await client.get(url + "/metrics")).text)
            samples.append((time.perf_counter(), m["minillm_num_requests_running"], m["minillm_num_requests_waiting"]))
        except Exception:  # noqa: BLE001 -- one missed sample must not stop the load it watches
            pass
        try:
            await asyncio.wait_for(stop.wait(), period_s)
        except asyncio.TimeoutError:
            pass
    return samples
