"""What the JupyterLab browser test (tests/test_jupyterlab.py) drives: a Chromium found on this
machine, and a JupyterLab server started from the project's environment in a scratch folder.

Run as a script it names the Chromium the test would use, or exits 1 saying how to get one
(the Makefile's `browser` target asks it before installing Debian's package).
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

CHROMIUM_ENV = "MINILLM_CHROMIUM"  # path of a Chromium/Chrome executable, overriding the search
# Debian's package first: Playwright's own browser download host is unreachable on our machines
SYSTEM_CHROMIUMS = ("/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
HOW_TO_GET_ONE = (
    "Install one: `sudo apt-get install chromium` on Debian/Ubuntu (`make test` does this itself when "
    f"run as root), or point {CHROMIUM_ENV} at a Chromium or Chrome executable, or run "
    "`.venv/bin/python -m playwright install chromium` where Playwright's download host is reachable."
)
# Headless on a machine without a display or a network: no sandbox (CI runs as root), no GPU,
# and none of Chromium's background connections (a closed network refuses them noisily).
BROWSER_EXIT_S = 30  # a closed Chromium's processes are gone within this
CHROMIUM_ARGS = (
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync",
)

# make lab's JupyterLab defaults (overrides.json: no news prompt); the test starts JupyterLab with them too
LAB_SETTINGS = Path(__file__).resolve().parent.parent / "minillm" / "course" / "lab_settings"
SERVER_START_S = 120  # the first start on a cold 2-core machine compiles nothing but imports a lot
SERVER_STOP_S = 30    # SIGTERM: the server shuts its kernels down, then exits
POLL_S = 0.25


class BrowserNotFound(RuntimeError):
    """No Chromium to drive; the message says how to get one."""


def find_chromium() -> str:
    """Path of the Chromium the browser test drives: $MINILLM_CHROMIUM, else the system's, else
    the one `playwright install chromium` downloaded. Raises BrowserNotFound saying how to get one."""
    override = os.environ.get(CHROMIUM_ENV)
    if override:
        if os.path.isfile(override) and os.access(override, os.X_OK):
            return override
        raise BrowserNotFound(f"{CHROMIUM_ENV}={override} is not an executable file. {HOW_TO_GET_ONE}")
    for name in SYSTEM_CHROMIUMS:
        path = shutil.which(name)
        if path:
            return path
    bundled = _playwright_chromium()
    if bundled:
        return bundled
    raise BrowserNotFound(f"No Chromium found for the JupyterLab browser test (looked for "
                          f"{', '.join(SYSTEM_CHROMIUMS)} and Playwright's own download). {HOW_TO_GET_ONE}")


def _playwright_chromium() -> str | None:
    """Playwright's downloaded Chromium, when `playwright install chromium` has run."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    with sync_playwright() as pw:
        path = pw.chromium.executable_path
    return path if path and os.path.isfile(path) else None


def pids_mentioning(text: str) -> list[int]:
    """Processes whose command line contains `text` (Linux /proc; empty elsewhere). Every process
    the browser test starts names its scratch folder, so this finds exactly the ones it started."""
    pids = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # exited while we looked
            continue
        if text in cmdline and int(entry.name) != os.getpid():
            pids.append(int(entry.name))
    return pids


def wait_until_gone(text: str, timeout_s: float) -> list[int]:
    """Wait for the processes naming `text` to exit; returns those still running at the timeout."""
    deadline = time.monotonic() + timeout_s
    while (left := pids_mentioning(text)) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    return left


class JupyterLab:
    """A JupyterLab server from this Python's environment (the project's .venv under `make test`),
    serving `root` on a free port, with every piece of its state (runtime files, settings,
    workspaces, IPython profile) in `state_dir`: nothing of the user's Jupyter setup leaks in and
    nothing it writes lands outside the two folders. Use as a context manager."""

    def __init__(self, root: Path, state_dir: Path):
        self.root, self.state_dir = Path(root), Path(state_dir)
        self.token = secrets.token_hex(16)
        self.proc: subprocess.Popen | None = None
        self.base_url = ""
        self.log_path = self.state_dir / "server.log"

    def url(self, path: str) -> str:
        """Absolute URL of `path` (e.g. "lab/tree/x.ipynb"), logged in with the token."""
        return f"{self.base_url}{path}?token={self.token}"

    def log_tail(self, n_chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-n_chars:] if self.log_path.exists() else ""

    def __enter__(self) -> "JupyterLab":
        runtime = self.state_dir / "runtime"
        for d in ("runtime", "config", "data", "lab-settings", "lab-workspaces", "ipython"):
            (self.state_dir / d).mkdir(parents=True, exist_ok=True)
        env = dict(os.environ,
                   JUPYTER_RUNTIME_DIR=str(runtime),
                   JUPYTER_CONFIG_DIR=str(self.state_dir / "config"),
                   JUPYTER_DATA_DIR=str(self.state_dir / "data"),
                   JUPYTERLAB_SETTINGS_DIR=str(self.state_dir / "lab-settings"),
                   JUPYTERLAB_WORKSPACES_DIR=str(self.state_dir / "lab-workspaces"),
                   IPYTHONDIR=str(self.state_dir / "ipython"),
                   # the environment's own kernel spec before any user-level "python3"
                   JUPYTER_PREFER_ENV_PATH="1")
        env.pop("JUPYTER_PATH", None)  # extra kernel-spec folders of the user's would come first
        cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1",
               "--port=0",  # the OS picks a free port; the server writes it to its runtime file
               f"--ServerApp.root_dir={self.root}", f"--IdentityProvider.token={self.token}",
               # nothing that reaches for the network: no extension manager, news or update check
               "--LabApp.extension_manager=readonly", "--LabApp.news_url=None",
               "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
               f"--LabApp.app_settings_dir={LAB_SETTINGS}"]
        if os.geteuid() == 0:  # CI runs as root; Jupyter refuses root without this
            cmd.append("--allow-root")
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, cwd=self.root)
        try:
            self.base_url = self._wait_for_server(runtime / f"jpserver-{self.proc.pid}.json")
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_for_server(self, info_file: Path) -> str:
        deadline = time.monotonic() + SERVER_START_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"JupyterLab exited with {self.proc.returncode}:\n{self.log_tail()}")
            if info_file.exists():
                try:
                    base_url = json.loads(info_file.read_text())["url"]
                    with urllib.request.urlopen(f"{base_url}api/status?token={self.token}", timeout=5):
                        return base_url
                except (ValueError, KeyError, OSError):  # file half-written, or not serving yet
                    pass
            time.sleep(POLL_S)
        raise TimeoutError(f"JupyterLab did not serve within {SERVER_START_S} s:\n{self.log_tail()}")

    def stop(self) -> None:
        """SIGTERM (the server shuts its kernels down), then SIGKILL whatever is left of the
        processes naming our folders: the server and its kernels, by process id."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(SERVER_STOP_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(SERVER_STOP_S)
        for folder in (self.state_dir, self.root):
            for pid in wait_until_gone(str(folder), SERVER_STOP_S):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def __exit__(self, *exc) -> None:
        self.stop()


if __name__ == "__main__":
    try:
        print(find_chromium())
    except BrowserNotFound as e:
        print(e, file=sys.stderr)
        sys.exit(1)


@contextmanager
def chromium_page(tmp_path: Path):
    """A page of a headless Chromium (the one find_chromium names) whose profile, cache and crash
    reports live under tmp_path; fails saying how to get a Chromium when there is none. On leaving, the
    browser is closed and none of its processes may outlive it."""
    try:
        chromium, missing = find_chromium(), ""
    except BrowserNotFound as e:
        chromium, missing = "", str(e)
    import pytest
    if missing:  # failed outside the except block, where pytest would print the message twice
        pytest.fail(missing, pytrace=False)
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright

    chromium_home = tmp_path / "chromium"
    # Chromium keeps its crash-report database and cache under the XDG folders: keep them here too
    browser_env = dict(os.environ, XDG_CONFIG_HOME=str(chromium_home / "config"),
                       XDG_CACHE_HOME=str(chromium_home / "cache"))
    with sync_playwright() as pw:
        try:
            browser, launch_error = pw.chromium.launch_persistent_context(
                str(chromium_home / "profile"), executable_path=chromium, headless=True,
                args=list(CHROMIUM_ARGS), env=browser_env), ""
        except PlaywrightError as e:
            browser, launch_error = None, e.message
        if launch_error:
            pytest.fail(f"Chromium {chromium} did not start: {launch_error[:2000]}\n{HOW_TO_GET_ONE}",
                        pytrace=False)
        try:
            yield browser.pages[0] if browser.pages else browser.new_page()
        finally:
            browser.close()
    leaked = wait_until_gone(str(chromium_home), BROWSER_EXIT_S)
    assert not leaked, f"browser processes still run after the test closed the browser: {leaked}"
