"""Lecture slides: one reveal.js deck per notebook, built with nbconvert's SlidesExporter.

    python -m minillm.course.slides                          # every notebooks/*.ipynb -> slides/
    python -m minillm.course.slides notebooks/01_*.ipynb     # some of them
    python -m minillm.course.slides --reveal-prefix reveal.js   # a local reveal.js copy (offline room)

Each notebook cell carries {"slideshow": {"slide_type": ...}}: "slide" starts a new slide,
"subslide" one below it, "fragment" appears on the next key press, "-" continues the current
slide, "skip" is left out. The deck keeps the notebook's outputs (plots, printed timings), so build
it from a notebook executed on the GPU. Building needs no network; showing the deck loads reveal.js
from --reveal-prefix (by default a CDN).
"""
from __future__ import annotations

import argparse
import glob
import os
import sys

from minillm.course.exercises import REPO_DIR

SLIDE_TYPES = ("slide", "subslide", "fragment", "-", "skip", "notes")


def slide_type(cell) -> str:
    return cell.get("metadata", {}).get("slideshow", {}).get("slide_type", "-")


def build_deck(notebook: str, out_dir: str | None = None, reveal_prefix: str | None = None) -> str:
    """Write <out_dir>/<notebook name>.slides.html (out_dir default: slides/ at the repo root). -> its path."""
    import nbformat
    from nbconvert import SlidesExporter

    nb = nbformat.read(notebook, as_version=4)
    bad = [i for i, c in enumerate(nb.cells) if slide_type(c) not in SLIDE_TYPES]
    if bad:
        raise ValueError(f"{notebook}: cells {bad[:5]} have an unknown slide_type; use one of {SLIDE_TYPES}")
    exporter = SlidesExporter()
    if reveal_prefix:
        exporter.reveal_url_prefix = reveal_prefix
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": _title(nb, notebook)}})
    out_dir = out_dir or os.path.join(REPO_DIR, "slides")
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, os.path.splitext(os.path.basename(notebook))[0] + ".slides.html")
    with open(path, "w", encoding="utf-8") as f:
        f.write(body)
    return path


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
    p.add_argument("--out", default=None, help="output folder (default: slides/)")
    p.add_argument("--reveal-prefix", default=None, help="where the deck loads reveal.js from (default: a CDN)")
    args = p.parse_args(argv)
    notebooks = args.notebooks or sorted(glob.glob(os.path.join(REPO_DIR, "notebooks", "*.ipynb")))
    if not notebooks:
        print("no notebooks found", file=sys.stderr)
        sys.exit(1)
    for nb in notebooks:
        try:
            print(build_deck(nb, args.out, args.reveal_prefix))
        except (OSError, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)


if __name__ == "__main__":
    main()
