"""Lecture slides: every notebook cell carries slide metadata, and `python -m minillm.course.slides`
builds a reveal.js deck that holds the notebook's slides (offline: building needs no network)."""
import glob
import os
import re

import nbformat
import pytest

from minillm.course.exercises import REPO_DIR
from minillm.course.slides import SLIDE_TYPES, build_deck, main, slide_type

NOTEBOOKS = sorted(glob.glob(os.path.join(REPO_DIR, "notebooks", "*.ipynb")))
TOUR = os.path.join(REPO_DIR, "notebooks", "00_tour.ipynb")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_every_cell_has_slide_metadata(path):
    nb = nbformat.read(path, as_version=4)
    missing = [i for i, c in enumerate(nb.cells) if c.get("metadata", {}).get("slideshow", {}).get("slide_type")
               not in SLIDE_TYPES]
    assert not missing, f"{os.path.basename(path)}: cells {missing} lack metadata.slideshow.slide_type"


def test_deck_has_the_notebooks_slides(tmp_path):
    nb = nbformat.read(TOUR, as_version=4)
    out = build_deck(TOUR, str(tmp_path))
    assert out == str(tmp_path / "00_tour.slides.html")
    html = open(out, encoding="utf-8").read()
    assert 'class="reveal"' in html and "Reveal.initialize" in html
    # one top-level <section> per "slide" cell (reveal.js nests subslides inside it)
    n_slides = sum(slide_type(c) == "slide" for c in nb.cells)
    top = re.search(r'<div class="slides">(.*)</div>\s*</div>', html, re.S).group(1)
    depth, top_level = 0, 0
    for tag in re.findall(r"</?section\b", top):
        if tag == "<section":
            top_level += depth == 0
            depth += 1
        else:
            depth -= 1
    assert top_level == n_slides
    # every numbered section heading of the notebook is rendered in the deck
    headings = [line[3:].strip() for c in nb.cells if c.cell_type == "markdown"
                for line in c.source.splitlines() if line.startswith("## ")]
    assert headings
    for h in headings:
        assert h.replace("&", "&amp;") in html, f"heading {h!r} missing from the deck"


def test_cli_builds_decks(tmp_path, capsys):
    main([TOUR, "--out", str(tmp_path), "--reveal-prefix", "reveal.js"])
    out = tmp_path / "00_tour.slides.html"
    assert out.exists() and str(out) in capsys.readouterr().out
    html = out.read_text(encoding="utf-8")
    assert '"reveal.js/dist/reveal.js"' in html and "unpkg.com" not in html  # the local copy, not the CDN
