"""Lecture slides: every notebook cell carries slide metadata, and `python -m minillm.course.slides`
builds reveal.js decks that open with the network off, carry speaker notes and fold long code.

The browser tests open the decks from the file system in a real Chromium (Playwright) in which
every request to anything but a local file is aborted and recorded: a deck that needs a CDN fails.
They need a Chromium: Debian's `apt-get install chromium`, or $MINILLM_CHROMIUM. Without one
they fail, saying how to get one. Building needs the npm tarballs of reveal.js and KaTeX, cached
in ~/.cache/minillm/npm after the first download (minillm.course.web_assets).
"""
from __future__ import annotations

import base64
import functools
import hashlib
import glob
import http.server
import io
import os
import re
import shutil
import socket
import struct
import tarfile
import threading
import zlib
from dataclasses import dataclass, field

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from minillm.course import web_assets
from minillm.course.exercises import REPO_DIR
from minillm.course.slides import (ASSETS_DIR, FOLD_CODE_LINES, LECTURER_FOLD_OPEN, SLIDE_TYPES, build_deck, fold_note,
                                   is_folded, is_lecturer_note, main, slide_type, unfold_note)

NOTEBOOKS = sorted(glob.glob(os.path.join(REPO_DIR, "notebooks", "*.ipynb")))
TOUR = os.path.join(REPO_DIR, "notebooks", "00_tour.ipynb")

CHROMIUM_ENV = "MINILLM_CHROMIUM"   # a Chromium/Chrome executable, overriding the search
CHROMIUMS = ("/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
HOW_TO_GET_A_BROWSER = (
    "The slide tests drive a real Chromium. Install one: `sudo apt-get install chromium` on Debian/Ubuntu, "
    f"or point {CHROMIUM_ENV} at a Chromium or Chrome executable, or run `.venv/bin/python -m playwright "
    "install chromium` where Playwright's download host is reachable.")
# Headless without a display or network: no sandbox (CI runs as root), no GPU, and none of
# Chromium's own background connections (they would be aborted and counted as the deck's).
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
LOCAL_URL_PREFIXES = ("file://", "data:", "about:")   # what an offline deck may load
READY_TIMEOUT_MS = 15_000


# ---------------------------------------------------------------- notebooks and decks, no browser

@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_every_cell_has_slide_metadata(path):
    nb = nbformat.read(path, as_version=4)
    missing = [i for i, c in enumerate(nb.cells) if c.get("metadata", {}).get("slideshow", {}).get("slide_type")
               not in SLIDE_TYPES]
    assert not missing, f"{os.path.basename(path)}: cells {missing} lack metadata.slideshow.slide_type"


def expected_slides(nb) -> tuple[int, int]:
    """(horizontal slides, all slides) of the notebook's deck. nbconvert opens the first slide at the
    first cell that is shown (whatever its type); then each "slide" cell opens a slide and each
    "slide" or "subslide" cell a (vertical) slide; notes and skipped cells open nothing."""
    shown = [slide_type(c) for c in nb.cells if slide_type(c) not in ("notes", "skip")]
    return 1 + sum(t == "slide" for t in shown[1:]), 1 + sum(t in ("slide", "subslide") for t in shown[1:])


@pytest.fixture(scope="module")
def decks(tmp_path_factory) -> dict[str, str]:
    """Every notebook's deck, built once by the command line into one folder -> {notebook: deck}."""
    out = tmp_path_factory.mktemp("slides")
    main([*NOTEBOOKS, "--out", str(out)])
    return {nb: str(out / (os.path.splitext(os.path.basename(nb))[0] + ".slides.html")) for nb in NOTEBOOKS}


def test_cli_builds_every_deck_with_its_assets(decks):
    for deck in decks.values():
        assert os.path.isfile(deck), deck
    assets = os.path.join(os.path.dirname(next(iter(decks.values()))), ASSETS_DIR)
    for pkg in web_assets.DECK_PACKAGES:
        assert os.path.isfile(os.path.join(assets, pkg.folder, "LICENSE")), f"{pkg.name} not vendored"


def test_decks_refer_only_to_local_files(decks):
    """Every script, style sheet and image a deck names is a relative path to a file it ships
    (links the reader may click, <a href>, can point anywhere)."""
    for deck in decks.values():
        html = open(deck, encoding="utf-8").read()
        refs = re.findall(r'<(?:script|img|iframe)\b[^>]*\bsrc="([^"]*)"|<link\b[^>]*\bhref="([^"]*)"', html)
        refs = [a or b for a, b in refs]
        assert any(r.endswith("/reveal.js") for r in refs), f"{deck} does not load reveal.js"
        for ref in refs:
            if ref.startswith("data:"):
                continue
            assert "://" not in ref and not ref.startswith("//"), f"{os.path.basename(deck)} loads {ref} from the network"
            assert os.path.isfile(os.path.join(os.path.dirname(deck), ref)), f"{deck} names {ref}, which is not there"
        assert "@import" not in html, f"{deck} imports a style sheet"


def test_deck_has_the_notebooks_slides(decks):
    nb = nbformat.read(TOUR, as_version=4)
    html = open(decks[TOUR], encoding="utf-8").read()
    assert 'class="reveal"' in html and "Reveal.initialize" in html
    # one top-level <section> per slide (reveal.js nests subslides inside it)
    top = re.search(r'<div class="slides">(.*)</div>\s*</div>', html, re.S).group(1)
    depth, top_level = 0, 0
    for tag in re.findall(r"</?section\b", top):
        if tag == "<section":
            top_level += depth == 0
            depth += 1
        else:
            depth -= 1
    assert top_level == expected_slides(nb)[0]
    # every numbered section heading of the notebook is rendered in the deck
    headings = [line[3:].strip() for c in nb.cells if c.cell_type == "markdown"
                for line in c.source.splitlines() if line.startswith("## ")]
    assert headings
    for h in headings:
        assert h.replace("&", "&amp;") in html, f"heading {h!r} missing from the deck"


# ---------------------------------------------------------------- a synthetic notebook with every feature

NOTE_A, NOTE_B = "NOTE-A: ask who has seen a KV cache", "NOTE-B: a note from a tagged cell"
LONG_CODE_MARK, BOUNDARY_CODE_MARK = "LONG_CODE_MARK", "BOUNDARY_CODE_MARK"
SKIPPED_TEXT, WIDGET_FALLBACK, TABLE_CELL = "SKIPPED-TEXT", "WIDGET-FALLBACK-TEXT", "TABLE-CELL-TEXT"
PLOT_SIZE = (40, 30)


def _png(width: int, height: int) -> bytes:
    """A small valid PNG (a two-colour gradient): the image output of a plot cell."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    row = b"\0" + b"".join(bytes((x * 255 // width, 80, 160)) for x in range(width))   # filter byte, RGB pixels
    rows = row * height
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)   # 8-bit RGB
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def _cell(source: str, slide: str, kind=new_markdown_cell, **metadata):
    return kind(source, metadata={"slideshow": {"slide_type": slide}, **metadata})


def synthetic_notebook():
    """Three slides, one with a subslide: speaker notes by slide_type (folded, as a lecturer's note is
    in the notebooks) and by tag, a long code cell
    with a plot, a code cell of exactly FOLD_CODE_LINES lines, math, an HTML table, a widget
    output (shown by its text fallback) and a skipped cell."""
    long_code = "\n".join([f"# {LONG_CODE_MARK}"] + [f"x{i} = {i}" for i in range(FOLD_CODE_LINES + 4)])
    boundary_code = "\n".join([f"# {BOUNDARY_CODE_MARK}"] + [f"y{i} = {i}" for i in range(FOLD_CODE_LINES - 1)])
    plot = _cell(long_code, "subslide", new_code_cell)
    plot.outputs = [new_output("display_data", data={
        "image/png": base64.b64encode(_png(*PLOT_SIZE)).decode(), "text/plain": "<Figure 40x30>"})]
    table = _cell("df", "fragment", new_code_cell)
    table.outputs = [new_output("execute_result", execution_count=1, data={
        "text/html": f"<table><tr><th>col</th></tr><tr><td>{TABLE_CELL}</td></tr></table>", "text/plain": "df"})]
    widget = _cell("slider", "slide", new_code_cell)
    widget.outputs = [new_output("display_data", data={
        "application/vnd.jupyter.widget-view+json": {"model_id": "abc", "version_major": 2, "version_minor": 0},
        "text/plain": WIDGET_FALLBACK})]
    hello = _cell("print('hello')", "-", new_code_cell)
    hello.outputs = [new_output("stream", name="stdout", text="hello\n")]
    boundary = _cell(boundary_code, "-", new_code_cell)
    return new_notebook(cells=[
        _cell("# A synthetic deck", "slide"),
        _cell(fold_note(NOTE_A), "notes"),
        hello,
        _cell(r"## Math: $x^2$ inline, and $$\sum_i x_i^2$$", "slide"),
        plot,
        _cell(NOTE_B, "-", tags=["notes"]),
        table,
        _cell(SKIPPED_TEXT, "skip"),
        widget,
        boundary,
    ])


def test_synthetic_notebook_counts():
    nb = synthetic_notebook()
    assert expected_slides(nb) == (3, 4)
    assert [slide_type(c) for c in nb.cells].count("notes") == 2   # by slide_type and by tag
    assert len(nb.cells[4].source.splitlines()) > FOLD_CODE_LINES == len(nb.cells[9].source.splitlines())


@pytest.fixture(scope="module")
def synthetic_deck(tmp_path_factory) -> tuple[object, str]:
    """(the synthetic notebook, its deck)."""
    folder = tmp_path_factory.mktemp("synthetic")
    nb = synthetic_notebook()
    path = folder / "synthetic.ipynb"
    nbformat.write(nb, str(path))
    return nb, build_deck(str(path), str(folder / "slides"))


def test_deck_html_folds_long_code_and_keeps_notes(synthetic_deck):
    _, deck = synthetic_deck
    html = open(deck, encoding="utf-8").read()
    folded = re.findall(r'<details class="minillm-folded-code".*?</details>', html, re.S)
    assert len(folded) == 1 and LONG_CODE_MARK in folded[0], "only the long code cell is folded"
    assert "<img" not in folded[0], "the plot is an output: it must stay outside the fold"
    assert BOUNDARY_CODE_MARK in html and SKIPPED_TEXT not in html
    notes = re.findall(r'<aside class="notes">(.*?)</aside>', html, re.S)
    assert len(notes) == 2 and NOTE_A in notes[0] and NOTE_B in notes[1]
    assert "<details" not in notes[0] and "Lecturer" not in notes[0], "the deck unfolds a folded note"


def test_fold_note_round_trip():
    folded = fold_note(NOTE_A)
    assert is_folded(folded) and folded.startswith(LECTURER_FOLD_OPEN) and fold_note(folded) == folded
    assert unfold_note(folded) == NOTE_A and unfold_note(NOTE_B) == NOTE_B


@pytest.mark.parametrize("notebook", sorted(glob.glob(os.path.join(REPO_DIR, "notebooks", "*.ipynb"))),
                         ids=os.path.basename)
def test_lecturer_notes_are_folded_for_students(notebook):
    """A student reading a notebook sees "Lecturer's notes" in place of what to say and the in-class
    question's answer; the notes written for a reader stay open, and nothing else is folded."""
    nb = nbformat.read(notebook, as_version=4)
    for i, cell in enumerate(nb.cells):
        lecturer = slide_type(cell) == "notes" and is_lecturer_note(unfold_note(cell.source))
        assert is_folded(cell.source) == lecturer, (
            f"cell {i}: {'fold it with minillm.course.slides.fold_note' if lecturer else 'not a lecturer note: unfold it'}"
            f": {cell.source[:120]!r}")


# ---------------------------------------------------------------- the real browser

@pytest.fixture(scope="module")
def browser():
    """A headless Chromium driven by Playwright; fails (never skips) without one."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("Playwright is not installed: `.venv/bin/python -m pip install -e '.[dev]'` "
                    "(or `pip install playwright`). " + HOW_TO_GET_A_BROWSER)
    executable = _find_chromium()
    pw = sync_playwright().start()
    try:
        browser = pw.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_ARGS)
    except Exception:
        pw.stop()
        raise
    yield browser
    browser.close()
    pw.stop()


def _find_chromium() -> str:
    override = os.environ.get(CHROMIUM_ENV)
    if override:
        if os.path.isfile(override) and os.access(override, os.X_OK):
            return override
        pytest.fail(f"{CHROMIUM_ENV}={override} is not an executable file. {HOW_TO_GET_A_BROWSER}")
    for name in CHROMIUMS:
        if path := shutil.which(name):
            return path
    from playwright.sync_api import sync_playwright
    with sync_playwright() as pw:   # Playwright's own download, where `playwright install` could run
        bundled = pw.chromium.executable_path
    if bundled and os.path.isfile(bundled):
        return bundled
    pytest.fail(f"No Chromium found (looked for {', '.join(CHROMIUMS)} and Playwright's download). "
                + HOW_TO_GET_A_BROWSER)


@dataclass
class Visit:
    """What a browser context did while showing decks: requests it aborted because they left the
    machine, local requests that failed, console errors and uncaught page errors."""
    blocked: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    loaded: list[str] = field(default_factory=list)

    def assert_clean(self, what: str) -> None:
        assert not self.blocked, f"{what} requested the network: {self.blocked}"
        assert not self.failed, f"{what}: requests failed: {self.failed}"
        assert not self.errors, f"{what}: console errors: {self.errors}"


def offline_context(browser) -> tuple[object, Visit]:
    """A fresh browser context (and profile) in which only local files load."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    visit = Visit()

    def route(route):
        url = route.request.url
        if url.startswith(LOCAL_URL_PREFIXES):
            route.continue_()
        else:
            visit.blocked.append(url)
            route.abort("internetdisconnected")

    def watch(page):
        page.on("request", lambda r: visit.loaded.append(r.url))
        page.on("requestfailed", lambda r: visit.failed.append(f"{r.url[:120]} ({r.failure})"))
        page.on("console", lambda m: m.type == "error" and visit.errors.append(m.text[:300]))
        page.on("pageerror", lambda e: visit.errors.append(f"uncaught: {e}"[:300]))

    context.route("**/*", route)
    context.on("page", watch)   # the deck's page and any window it opens (the speaker view)
    return context, visit


def open_deck(context, deck: str):
    """Open the deck from the file system and wait until reveal.js is ready -> the page."""
    page = context.new_page()
    page.goto("file://" + os.path.abspath(deck))
    page.wait_for_function("window.Reveal && Reveal.isReady()", timeout=READY_TIMEOUT_MS)
    page.evaluate("document.fonts.ready.then(() => true)")
    return page


DECK_FACTS = """() => ({
    horizontal: Reveal.getHorizontalSlides().length,
    total: Reveal.getTotalSlides(),
    katex: document.querySelectorAll('.katex').length,
    katexErrors: [...document.querySelectorAll('.katex-error')].map(e => e.title || e.textContent),
    brokenImages: [...document.images].filter(i => !i.complete || i.naturalWidth === 0).map(i => i.src.slice(0, 80)),
    fontErrors: [...document.fonts].filter(f => f.status === 'error').map(f => f.family),
    notes: document.querySelectorAll('aside.notes').length,
})"""


def test_synthetic_deck_offline_in_the_browser(browser, synthetic_deck):
    nb, deck = synthetic_deck
    context, visit = offline_context(browser)
    try:
        page = open_deck(context, deck)
        slides = page.locator(".reveal .slides")   # not reveal's screen-reader copy of the slide
        facts = page.evaluate(DECK_FACTS)
        assert (facts["horizontal"], facts["total"]) == expected_slides(nb)
        assert facts["katex"] == 2 and not facts["katexErrors"], facts
        assert not facts["brokenImages"] and not facts["fontErrors"], facts
        for asset in ("dist/reveal.js", "dist/plugin/notes.js", "dist/katex.min.js", "dist/theme/white.css"):
            assert any(u.startswith("file://") and u.endswith(asset) for u in visit.loaded), f"{asset} not loaded"

        # notes: one <aside> per notes cell, on the slide it follows
        assert facts["notes"] == 2
        assert NOTE_A in page.inner_text("section >> nth=0 >> aside.notes")

        # the long code cell: folded and closed, its plot shown on its (vertical) slide
        page.evaluate("Reveal.slide(1, 1)")
        fold = page.locator("details.minillm-folded-code")
        assert fold.count() == 1 and fold.get_attribute("open") is None
        assert not slides.get_by_text(LONG_CODE_MARK).is_visible()
        plot = page.locator("section.present img")
        plot.wait_for(state="visible")
        assert plot.evaluate("i => [i.naturalWidth, i.naturalHeight]") == list(PLOT_SIZE)
        fold.locator("summary").click()
        assert slides.get_by_text(LONG_CODE_MARK).is_visible(), "a click opens the folded code"
        assert slides.get_by_text(TABLE_CELL).count() == 1

        page.evaluate("Reveal.slide(2, 0)")
        assert slides.get_by_text(WIDGET_FALLBACK).is_visible(), "a widget shows its text without a widget manager"
        assert slides.get_by_text(BOUNDARY_CODE_MARK).is_visible(), f"{FOLD_CODE_LINES} lines stay unfolded"
        assert slides.get_by_text(SKIPPED_TEXT).count() == 0

        # S opens the speaker view, which shows the current slide's notes
        page.evaluate("Reveal.slide(0, 0)")
        with context.expect_page() as popup:
            page.keyboard.press("s")
        speaker = popup.value
        notes_js = "t => (document.querySelector('.speaker-controls-notes .value') || {}).textContent?.includes(t)"
        speaker.wait_for_function(notes_js, arg=NOTE_A, timeout=READY_TIMEOUT_MS)
        page.evaluate("Reveal.slide(1, 1)")
        speaker.wait_for_function(notes_js, arg=NOTE_B, timeout=READY_TIMEOUT_MS)
        visit.assert_clean("the synthetic deck")
    finally:
        context.close()


def test_the_offline_check_catches_a_cdn_deck(browser, synthetic_deck, tmp_path):
    """nbconvert's own deck loads reveal.js from a CDN: the same check must fail on it."""
    from nbconvert import SlidesExporter

    nb, _ = synthetic_deck
    cdn_deck = tmp_path / "cdn.slides.html"
    cdn_deck.write_text(SlidesExporter().from_notebook_node(nb)[0], encoding="utf-8")
    context, visit = offline_context(browser)
    try:
        page = context.new_page()
        page.goto(cdn_deck.as_uri())
        page.wait_for_load_state("load")
        assert visit.blocked and not page.evaluate("!!(window.Reveal && Reveal.isReady && Reveal.isReady())")
        with pytest.raises(AssertionError, match="requested the network"):
            visit.assert_clean("the CDN deck")
    finally:
        context.close()


def test_every_notebook_deck_offline_in_the_browser(browser, decks):
    context, visit = offline_context(browser)
    try:
        for notebook, deck in decks.items():
            page = open_deck(context, deck)
            facts = page.evaluate(DECK_FACTS)
            name = os.path.basename(deck)
            nb = nbformat.read(notebook, as_version=4)
            assert (facts["horizontal"], facts["total"]) == expected_slides(nb), name
            assert not facts["katexErrors"], f"{name}: math KaTeX cannot render: {facts['katexErrors']}"
            assert not facts["brokenImages"] and not facts["fontErrors"], f"{name}: {facts}"
            n_notes = sum(slide_type(c) == "notes" for c in nb.cells)
            assert facts["notes"] == n_notes, name
            page.close()
        visit.assert_clean("the notebooks' decks")
    finally:
        context.close()


# ---------------------------------------------------------------- the npm download, against a local registry

FAKE = {"LICENSE": b"MIT", "dist/app.js": b"window.app = 1;", "dist/fonts/f.woff2": b"font",
        "dist/unused.js": b"not copied"}


def _fake_tarball(files: dict[str, bytes], evil: bool = False) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo("package/" + name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        if evil:   # a path that climbs out of the package must never be written
            info = tarfile.TarInfo("package/../../escaped.js")
            info.size = 3
            tar.addfile(info, io.BytesIO(b"bad"))
    return buf.getvalue()


def _integrity(data: bytes) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()


@pytest.fixture
def registry(tmp_path, monkeypatch):
    """A local npm registry serving one fake package; the cache is a scratch folder ->
    (the package pinned to the served tarball, the list of paths the server was asked for)."""
    data = _fake_tarball(FAKE, evil=True)
    served = tmp_path / "registry"
    (served / "fake" / "-").mkdir(parents=True)
    (served / "fake" / "-" / "fake-1.0.0.tgz").write_bytes(data)
    requests: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def do_GET(self):
            requests.append(self.path)
            super().do_GET()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(served)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv(web_assets.REGISTRY_ENV, f"http://127.0.0.1:{server.server_address[1]}/")
    monkeypatch.setenv("MINILLM_CACHE", str(tmp_path / "cache"))
    pkg = web_assets.NpmPackage("fake", "1.0.0", _integrity(data), files=("LICENSE", "dist/app.js", "dist/fonts/"))
    yield pkg, requests
    server.shutdown()
    server.server_close()
    thread.join()


def test_install_downloads_checks_caches_and_copies_only_named_files(registry, tmp_path):
    pkg, requests = registry
    folder = web_assets.install(pkg, str(tmp_path / "a" / "assets"))
    copied = sorted(os.path.relpath(os.path.join(d, f), folder) for d, _, fs in os.walk(folder) for f in fs)
    assert copied == sorted(["LICENSE", "dist/app.js", "dist/fonts/f.woff2", web_assets.COMPLETE_MARKER])
    assert open(os.path.join(folder, "dist", "app.js"), "rb").read() == FAKE["dist/app.js"]
    assert not list(tmp_path.rglob("escaped.js")), "a tarball path escaped the asset folder"
    assert requests == ["/fake/-/fake-1.0.0.tgz"]
    web_assets.install(pkg, str(tmp_path / "b" / "assets"))   # a second output folder: from the cache
    assert len(requests) == 1


def test_a_tarball_that_fails_its_pin_is_refused(registry, tmp_path):
    pkg, _ = registry
    wrong = web_assets.NpmPackage(pkg.name, pkg.version, _integrity(b"something else"), pkg.files)
    with pytest.raises(web_assets.AssetUnavailable, match="integrity"):
        web_assets.install(wrong, str(tmp_path / "assets"))
    assert not os.listdir(web_assets.npm_cache_dir()), "a refused download must not stay in the cache"
    assert not (tmp_path / "assets").exists() or not os.listdir(tmp_path / "assets")


def test_a_corrupt_cached_tarball_is_fetched_again(registry, tmp_path):
    pkg, requests = registry
    os.makedirs(web_assets.npm_cache_dir())
    with open(os.path.join(web_assets.npm_cache_dir(), pkg.tarball_name), "wb") as f:
        f.write(b"truncated")
    web_assets.install(pkg, str(tmp_path / "assets"))
    assert requests == ["/fake/-/fake-1.0.0.tgz"]
    assert web_assets.integrity_of(os.path.join(web_assets.npm_cache_dir(), pkg.tarball_name)) == pkg.integrity


def test_no_network_and_no_cache_says_what_to_do(tmp_path, monkeypatch):
    with socket.socket() as s:   # a port nobody listens on: the registry is unreachable
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv(web_assets.REGISTRY_ENV, f"http://127.0.0.1:{port}/")
    monkeypatch.setenv("MINILLM_CACHE", str(tmp_path / "cache"))
    with pytest.raises(web_assets.AssetUnavailable) as e:
        web_assets.tarball(web_assets.REVEAL)
    message = str(e.value)
    assert web_assets.REVEAL.tarball_name in message and web_assets.npm_cache_dir() in message
    assert f"npm pack reveal.js@{web_assets.REVEAL.version}" in message
    assert not os.listdir(web_assets.npm_cache_dir()), "no partial download left behind"
