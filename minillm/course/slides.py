"""Lecture slides: one reveal.js deck per notebook, that opens with the network off.

    python -m minillm.course.slides                          # every notebooks/*.ipynb -> slides/
    python -m minillm.course.slides notebooks/01_*.ipynb     # some of them
    python -m minillm.course.slides --out /media/usb/slides  # another folder

Each notebook cell carries {"slideshow": {"slide_type": ...}}: "slide" starts a new slide,
"subslide" one below it, "fragment" appears on the next key press, "-" continues the current
slide, "skip" is left out, "notes" is a speaker note of the current slide. A cell tagged "notes"
is a speaker note too, whatever its slide_type. Press S in the deck for the speaker view.

A note written for the lecturer (what to say, the question to ask and its answer) is folded in the
notebook, so a student reading it sees only "Lecturer's notes" until they open it:
LECTURER_FOLD_OPEN + the note + LECTURER_FOLD_CLOSE. The deck unfolds it: the speaker view shows
the whole note from the slide's start.

A code cell longer than FOLD_CODE_LINES lines is folded on its slide (a "code: N lines" line
that opens on a click); its outputs stay visible. The deck keeps the notebook's outputs (plots,
printed timings), so build it from a notebook executed on the GPU.

Offline: the decks load reveal.js and KaTeX (for the math) from <out>/assets/, which the build
writes from npm tarballs cached in ~/.cache/minillm/npm (see minillm.course.web_assets). The
first build on a machine downloads them from the npm registry; later builds need no network,
and the output folder can be copied anywhere (a USB stick) and opened from the file system.
"""
from __future__ import annotations

import argparse
import copy
import glob
import os
import sys

from minillm.course import web_assets
from minillm.course.exercises import REPO_DIR

SLIDE_TYPES = ("slide", "subslide", "fragment", "-", "skip", "notes")
NOTES_TAG = "notes"            # a cell with this tag is a speaker note, whatever its slide_type
FOLD_CODE_LINES = 15           # longer code cells are folded on the slide (their outputs are not)
ASSETS_DIR = "assets"          # beside the decks; the decks refer to it by this relative path
THEME = "white"                # reveal's white theme inlines its fonts; others @import Google Fonts
TEMPLATE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates")
TEMPLATE_NAME = "minillm_reveal"
# What an output shows, best first: nbconvert's list without the types that need a script from
# a CDN (widget views, application/javascript via require.js, mermaid). Such an output falls
# back to the next type it carries (its HTML, image or text/plain).
LECTURER_FOLD_OPEN = "<details><summary>Lecturer's notes</summary>\n\n"  # the blank line lets markdown render inside
LECTURER_FOLD_CLOSE = "\n\n</details>"
# A note that uses one of these labels talks to the lecturer (the kit's say / point at / ask / watch for)
LECTURER_LABELS = ("**Say", "**Point at", "**Ask", "**Watch for")
OUTPUT_PRIORITY = ("text/html", "text/markdown", "image/svg+xml", "text/latex", "image/png", "image/jpeg",
                   "text/plain")


def slide_type(cell) -> str:
    """The cell's slide type as the deck uses it: "notes" for a cell tagged NOTES_TAG."""
    if NOTES_TAG in cell.get("metadata", {}).get("tags", []):
        return "notes"
    return cell.get("metadata", {}).get("slideshow", {}).get("slide_type", "-")


def build_deck(notebook: str, out_dir: str | None = None, exporter=None) -> str:
    """Write <out_dir>/<notebook name>.slides.html and the assets it loads into <out_dir>/assets/
    (out_dir default: slides/ at the repo root) -> the deck's path. `exporter` reuses one from
    make_exporter() across decks (building one takes a second)."""
    import nbformat

    nb = nbformat.read(notebook, as_version=4)
    bad = [i for i, c in enumerate(nb.cells) if slide_type(c) not in SLIDE_TYPES]
    if bad:
        raise ValueError(f"{notebook}: cells {bad[:5]} have an unknown slide_type; use one of {SLIDE_TYPES}")
    out_dir = out_dir or os.path.join(REPO_DIR, "slides")
    folders = web_assets.install_all(os.path.join(out_dir, ASSETS_DIR))
    exporter = exporter or make_exporter()
    exporter.reveal_url_prefix = _relative(folders[web_assets.REVEAL.name], out_dir)
    resources = {"metadata": {"name": _title(nb, notebook)},
                 "minillm": {"katex": _relative(folders[web_assets.KATEX.name], out_dir),
                             "fold_code_lines": FOLD_CODE_LINES}}
    body, _ = exporter.from_notebook_node(_for_deck(nb), resources=resources)
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, os.path.splitext(os.path.basename(notebook))[0] + ".slides.html")
    with open(path, "w", encoding="utf-8") as f:
        f.write(body)
    return path


def make_exporter():
    """nbconvert's SlidesExporter with minillm's offline template."""
    from nbconvert import SlidesExporter
    from traitlets.config import Config

    config = Config({"NbConvertBase": {"display_data_priority": list(OUTPUT_PRIORITY)}})
    exporter = SlidesExporter(config=config, extra_template_basedirs=[TEMPLATE_DIR], template_name=TEMPLATE_NAME)
    exporter.reveal_theme = THEME
    return exporter


def _for_deck(nb):
    """A copy of the notebook in which every cell tagged NOTES_TAG has slide_type "notes" and every
    folded lecturer's note is unfolded."""
    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        if NOTES_TAG in cell.get("metadata", {}).get("tags", []):
            cell.metadata.setdefault("slideshow", {})["slide_type"] = "notes"
        if slide_type(cell) == "notes":
            cell.source = unfold_note(cell.source)
    return nb


def fold_note(source: str) -> str:
    """A lecturer's note as the notebook keeps it: folded under "Lecturer's notes" (idempotent)."""
    return source if is_folded(source) else LECTURER_FOLD_OPEN + source.strip("\n") + LECTURER_FOLD_CLOSE


def unfold_note(source: str) -> str:
    """The note inside a fold_note() wrapper; any other source unchanged."""
    if not is_folded(source):
        return source
    return source[len(LECTURER_FOLD_OPEN):len(source) - len(LECTURER_FOLD_CLOSE)]


def is_lecturer_note(source: str) -> bool:
    """Whether a notes cell talks to the lecturer (folded in the notebook) rather than to a reader."""
    return any(label in source for label in LECTURER_LABELS)


def is_folded(source: str) -> bool:
    return source.startswith(LECTURER_FOLD_OPEN) and source.endswith(LECTURER_FOLD_CLOSE)


def _relative(folder: str, out_dir: str) -> str:
    """The folder as the deck refers to it: relative to out_dir, with forward slashes (a URL)."""
    return os.path.relpath(folder, out_dir).replace(os.sep, "/")


def _title(nb, notebook: str) -> str:
    """The notebook's first markdown heading (the deck's <title>), else its file name."""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("#"):
                    return line.lstrip("#").strip()
    return os.path.basename(notebook)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m minillm.course.slides", description=__doc__.split("\n")[0])
    p.add_argument("notebooks", nargs="*", help="default: every notebooks/*.ipynb")
    p.add_argument("--out", default=None, help="output folder (default: slides/); the decks and assets/ go there")
    args = p.parse_args(argv)
    notebooks = args.notebooks or sorted(glob.glob(os.path.join(REPO_DIR, "notebooks", "*.ipynb")))
    if not notebooks:
        print("no notebooks found", file=sys.stderr)
        sys.exit(1)
    exporter = make_exporter()
    for nb in notebooks:
        try:
            print(build_deck(nb, args.out, exporter))
        except (OSError, ValueError, web_assets.AssetUnavailable) as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)


if __name__ == "__main__":
    main()
