"""The student's front end, in a real browser: JupyterLab from the project's environment opens
notebooks/00_tour.ipynb in headless Chromium (driven by Playwright), its first code cells run
through the UI (select a cell, Shift+Enter), and their outputs appear with no error.

The server serves a scratch copy of notebooks/ (outputs cleared, so every output seen here came
from this run, and autosave never touches the committed notebooks). Without a Chromium the test
fails and says how to get one; `make test` installs Debian's package first.
"""
from __future__ import annotations

import re
import shutil
import sys
import time
from pathlib import Path

import nbformat
import pytest

from jupyter_browser import BROWSER_EXIT_S, JupyterLab, chromium_page, wait_until_gone
from minillm.course.slides import is_folded

REPO = Path(__file__).resolve().parent.parent
TOUR = "00_tour.ipynb"
# The tour's first three code cells: imports and device, loading smollm2-135m (its first use on a
# machine also converts the GGUF, ~20 s) and a batch of four 24-token generations. Measured through
# JupyterLab on a shared 2-core CPU machine (load average 4-11 from other jobs): 2-7 s, 2.5-10 s and
# 21-170 s. Past them the tour starts the CLI in subprocesses, each loading the model again.
FIRST_CODE_CELLS = 3
# Appended to the scratch copy and run last: the kernel JupyterLab offers must be this environment's,
# and a tqdm bar must render as a widget (ipywidgets), not as text.
PROBE_SOURCE = """import sys
from tqdm.auto import tqdm
for _ in tqdm(range(3), desc="tqdm probe"):
    pass
print("kernel python:", sys.executable)"""

TEST_TIMEOUT_S = 900          # pytest-timeout: the whole test, whatever hangs
UI_TIMEOUT_MS = 120_000       # page load, kernel start, a click
CELL_START_TIMEOUT_MS = 30_000   # from Shift+Enter to the cell's "[*]" prompt
CELL_TIMEOUT_MS = 420_000     # one cell, start to finish (model conversion on a busy CPU)
SAVE_TIMEOUT_S = 30

# The notebook's kernel is started and idle: the toolbar names a kernel and the execution
# indicator reads idle (it reads idle before any kernel exists, too, so both are needed).
KERNEL_READY_JS = """() => {
  const name = document.querySelector('.jp-NotebookPanel .jp-Toolbar-kernelName');
  const status = document.querySelector('.jp-NotebookPanel .jp-Notebook-ExecutionIndicator');
  return !!(name && status && !/No Kernel/.test(name.textContent) && status.dataset.status === 'idle');
}"""
NEWS_PROMPT = "Would you like to get notified about official Jupyter news?"
NOT_RUN_PROMPT = "[ ]:"
DONE_PROMPT = re.compile(r"^\[\d+\]:$")


def _scratch_notebooks(dest: Path) -> Path:
    """A copy of notebooks/ with the tour's outputs cleared and the kernel probe appended."""
    shutil.copytree(REPO / "notebooks", dest, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    nb = nbformat.read(dest / TOUR, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nb.cells.append(nbformat.v4.new_code_cell(PROBE_SOURCE))
    nbformat.write(nb, dest / TOUR)
    return dest


def _run_cell(page, cell, label: str, keys: str = "Shift+Enter") -> str:
    """Select `cell`, press `keys`, wait for it to finish; returns the output text it shows."""
    from playwright.sync_api import expect

    prompt = cell.locator(".jp-InputPrompt")
    prompt.click()
    page.keyboard.press(keys)
    expect(prompt, f"{label}: {keys} did not start it").not_to_have_text(
        NOT_RUN_PROMPT, timeout=CELL_START_TIMEOUT_MS)
    expect(prompt, f"{label}: did not finish").to_have_text(DONE_PROMPT, timeout=CELL_TIMEOUT_MS)
    text = "\n".join(cell.locator(".jp-OutputArea-output").all_inner_texts())
    assert text.strip(), f"{label} ran but JupyterLab shows no output under it"
    return text


def _ran_cells(nb: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    """The code cells the test runs: the tour's first FIRST_CODE_CELLS and the kernel probe."""
    code = [c for c in nb.cells if c.cell_type == "code"]
    return code[:FIRST_CODE_CELLS] + [c for c in code if c.source == PROBE_SOURCE]


def _wait_for_saved(path: Path) -> list[nbformat.NotebookNode]:
    """The cells the test ran, read back from the saved file once they all carry their outputs."""
    deadline = time.monotonic() + SAVE_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            ran = _ran_cells(nbformat.read(path, as_version=4))
        except ValueError:  # read while JupyterLab was writing it
            ran = []
        if len(ran) == FIRST_CODE_CELLS + 1 and all(c.execution_count is not None for c in ran):
            return ran
        time.sleep(0.25)
    pytest.fail(f"Ctrl+S did not save the executed cells into {path} within {SAVE_TIMEOUT_S} s")


def _drive_tour(page, lab: JupyterLab, notebooks: Path) -> tuple[dict[str, str], list[nbformat.NotebookNode]]:
    """Open the tour, run its first code cells and the probe through the UI, save it. Returns the
    output text each showed (by label) and the same cells as saved."""
    timings: dict[str, float] = {}  # printed: pytest shows them when the test fails
    t0 = time.perf_counter()
    shown: dict[str, str] = {}
    try:
        page.set_default_timeout(UI_TIMEOUT_MS)
        page.goto(lab.url(f"lab/tree/{TOUR}"))
        page.wait_for_function(KERNEL_READY_JS, timeout=UI_TIMEOUT_MS)
        timings["notebook open, kernel idle"] = time.perf_counter() - t0
        # the lecturer's notes (what to say, the in-class answers) show to a student as one closed line each;
        # JupyterLab renders the cells far below the fold later, so it checks those it has rendered
        assert any(is_folded(c.source) for c in nbformat.read(notebooks / TOUR, as_version=4).cells)
        folds = page.locator(".jp-NotebookPanel .jp-MarkdownCell details")
        folds.first.wait_for(state="attached")
        assert folds.evaluate_all("ds => ds.filter(d => d.open).length") == 0, "a lecturer's note renders open"
        assert set(folds.locator("summary").evaluate_all("ss => ss.map(s => s.textContent)")) == {"Lecturer's notes"}
        cells = page.locator(".jp-NotebookPanel .jp-Notebook .jp-CodeCell")
        assert cells.count() > FIRST_CODE_CELLS, f"{TOUR} has fewer than {FIRST_CODE_CELLS} code cells to run"
        for i in range(FIRST_CODE_CELLS):
            label = f"{TOUR} code cell {i + 1}"
            shown[label] = _run_cell(page, cells.nth(i), label)
            timings[f"code cell {i + 1} done"] = time.perf_counter() - t0
        # Ctrl+Enter runs it in place (Shift+Enter on the last cell would append an empty one)
        probe = cells.last
        shown["kernel probe cell"] = _run_cell(page, probe, "kernel probe cell", keys="Control+Enter")
        assert probe.locator(".jupyter-widgets .widget-hprogress").count() == 1, (
            "tqdm's bar did not render as a widget in JupyterLab (is ipywidgets installed?): "
            f"{shown['kernel probe cell']!r}")
        # make lab's settings (minillm/course/lab_settings): no popup over the notebook asking to fetch news
        assert page.get_by_text(NEWS_PROMPT).count() == 0, f"JupyterLab shows {NEWS_PROMPT!r}"
        page.keyboard.press("Control+s")  # so the outputs can be checked in the file too
        return shown, _wait_for_saved(notebooks / TOUR)
    finally:
        print("seconds since the notebook was requested:", {k: round(v, 1) for k, v in timings.items()})


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_tour_runs_in_jupyterlab(tmp_path):
    notebooks = _scratch_notebooks(tmp_path / "notebooks")
    with JupyterLab(notebooks, tmp_path / "jupyter") as lab, chromium_page(tmp_path) as page:
        shown, saved = _drive_tour(page, lab, notebooks)
    leaked = wait_until_gone(str(tmp_path), BROWSER_EXIT_S)
    assert not leaked, f"processes the test started still run after it stopped them: {leaked}"

    for label, cell in zip(shown, saved):
        errors = [o for o in cell.outputs if o.output_type == "error"]
        assert not errors, (f"{label} raised {errors[0].ename}: {errors[0].evalue}; JupyterLab shows:\n"
                            f"{shown[label][-2000:]}")
    probe = shown["kernel probe cell"]
    assert f"kernel python: {sys.executable}" in probe.splitlines(), (
        f"JupyterLab's kernel is not this environment's Python ({sys.executable}): {probe!r}")
