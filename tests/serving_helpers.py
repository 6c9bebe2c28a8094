"""A real minillm server in a background thread, for tests: `with running_server(...) as base_url:`.

The socket is bound (to a free port) and listening before the server thread starts, so a client may
connect at once: its connection waits in the backlog until uvicorn accepts it. Leaving the block
stops uvicorn (bounded), stops the engine (thread or process) and frees it; the port is closed.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass

from helpers import small_engine_args

START_TIMEOUT_S = 60
STOP_TIMEOUT_S = 30


@dataclass
class ServerHandle:
    base_url: str  # http://127.0.0.1:PORT (no trailing slash; the OpenAI client wants base_url + "/v1")
    async_llm: object  # the EngineClient (an AsyncLLM: its engine too), for white-box checks
    model: str


def engine_client(model: str, engine_core: str, max_waiting: int = 256, **engine_args):
    """An AsyncLLM (engine_core "thread") or an EngineCoreClient ("process") over `model` with small CPU
    engine args (overridden by engine_args)."""
    if engine_core == "process":
        from minillm.serving.engine_core import EngineCoreClient
        # the engine process reads it as torch starts: one intra-op thread, as one_torch_thread gives tests
        saved = os.environ.get("OMP_NUM_THREADS")
        os.environ["OMP_NUM_THREADS"] = "1"
        try:
            return EngineCoreClient(model, small_engine_args(**engine_args), max_waiting=max_waiting)
        finally:
            if saved is None:
                del os.environ["OMP_NUM_THREADS"]
            else:
                os.environ["OMP_NUM_THREADS"] = saved
    from minillm import LLM
    from minillm.serving.async_engine import AsyncLLM
    return AsyncLLM(LLM(model, **small_engine_args(**engine_args)), max_waiting=max_waiting)


@contextmanager
def server_handle(model: str = "qwen3-tiny", api_key: str | None = None, max_waiting: int = 256,
                  engine_core: str = "thread", **engine_args):
    """running_server, yielding a ServerHandle (base_url, async_llm) instead of the bare URL."""
    import uvicorn

    from minillm.serving.server import create_app

    async_llm = engine_client(model, engine_core, max_waiting, **engine_args)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", 0))
        sock.listen(512)
        server = uvicorn.Server(uvicorn.Config(create_app(async_llm, model, api_key), log_level="warning",
                                               timeout_graceful_shutdown=5, lifespan="off"))
        thread = threading.Thread(target=server.run, kwargs=dict(sockets=[sock]), name="uvicorn", daemon=True)
        thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not server.started:  # a flag uvicorn sets, no event: poll it, bounded
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        try:
            yield ServerHandle(f"http://127.0.0.1:{sock.getsockname()[1]}", async_llm, model)
        finally:
            server.should_exit = True
            thread.join(STOP_TIMEOUT_S)
            assert not thread.is_alive(), "uvicorn did not stop"
    finally:
        sock.close()
        async_llm.shutdown()


@contextmanager
def running_server(model: str = "qwen3-tiny", **engine_args):
    """A server for `model` (small CPU engine args, tests/helpers.py, overridden by engine_args; also
    api_key=, max_waiting= and engine_core=) -> its base URL, e.g. http://127.0.0.1:40123."""
    with server_handle(model, **engine_args) as handle:
        yield handle.base_url


SERVE_URL_LINE = "/v1 (OpenAI API"  # what `serve` prints once it listens: "minillm serves M at URL/v1 (OpenAI API ...)"


@contextmanager
def serve_process(*args: str, exit_status: int = 0, output: list[str] | None = None):
    """`python -m minillm serve ARGS --port 0` as a process of its own, yielding its base URL once it
    listens. Leaving the block sends SIGTERM and checks the exit status (a failure shows the server's
    output); the process is killed if it is still there. output: a list that receives the server's
    output lines (stdout and stderr) once it has exited."""
    # stdout too: uvicorn's access log goes there, the rest of the server's log to stderr
    proc = subprocess.Popen([sys.executable, "-m", "minillm", "serve", *args, "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True)
    log = []
    try:
        for line in proc.stdout:
            log.append(line)
            if SERVE_URL_LINE in line:
                break
        assert log and SERVE_URL_LINE in log[-1], "the server exited before it listened:\n" + "".join(log)
        url = log[-1].split(" at ", 1)[1].split("/v1", 1)[0]
        # read on while it serves: a full pipe would stop the server at its next log line
        reader = threading.Thread(target=lambda: log.extend(proc.stdout), name="serve-output", daemon=True)
        reader.start()
        yield url
        proc.send_signal(signal.SIGTERM)
        status = proc.wait(60)
        reader.join(STOP_TIMEOUT_S)  # the pipe ends with the process
        if output is not None:
            output.extend(log)
        assert status == exit_status, "".join(log)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
