"""The course's signposts lead somewhere: every exercise names a section its notebook has, and the
tour's map (notebooks/00_tour.ipynb, section 8) lists every chapter notebook and exercise, in the
outputs a student reads."""
import os
import re

import nbformat

from minillm.course.exercises import REPO_DIR, find_exercises

NOTEBOOKS = os.path.join(REPO_DIR, "notebooks")
TOUR = os.path.join(NOTEBOOKS, "00_tour.ipynb")
MAP_CELL = "CHAPTERS = {"  # the tour's code cell that prints the course map


def headings(path: str) -> set[str]:
    """A notebook's markdown headings, without their #s and backticks (an exercise's section names
    `tl.dot` as tl.dot)."""
    nb = nbformat.read(path, as_version=4)
    return {line.lstrip("#").strip().replace("`", "") for c in nb.cells if c.cell_type == "markdown"
            for line in c.source.splitlines() if line.startswith("#")}


def test_every_exercise_names_a_section_its_notebook_has():
    missing = [(e.id, e.notebook, e.section) for e in find_exercises()
               if e.section.replace("`", "") not in headings(os.path.join(REPO_DIR, e.notebook))]
    assert not missing, f"exercises whose notebook section does not exist (fix the region's marker): {missing}"


def test_the_tours_map_lists_every_notebook_and_exercise():
    nb = nbformat.read(TOUR, as_version=4)
    cells = [c for c in nb.cells if c.cell_type == "code" and MAP_CELL in c.source]
    assert len(cells) == 1, f"{TOUR} has no single course-map cell ({MAP_CELL!r})"
    shown = "".join(o.get("text", "") for o in cells[0].outputs)
    chapters = sorted(f for f in os.listdir(NOTEBOOKS) if re.match(r"0[1-9]", f) and f.endswith(".ipynb"))
    absent = [f for f in chapters if f not in shown]
    absent += [e.id for e in find_exercises() if not re.search(rf"\b{re.escape(e.id)}\b", shown)]
    absent += [e.module.replace(".", "/") + ".py" for e in find_exercises()
               if e.module.replace(".", "/") + ".py" not in shown]
    assert not absent, (f"the tour's course map (its stored output) leaves out {sorted(set(absent))}: "
                        f"re-run notebooks/00_tour.ipynb after adding a chapter")


def test_every_exercise_notebook_runs_the_readers_code_after_its_switch():
    """Each notebook with exercises has the USE_MY_CODE switch of their chapter, and imports the exercises'
    functions by name only after it (an import before the switch keeps minillm's function whatever the
    switch says). Notebook 04 had no switch: its 4.x ran minillm's code alone."""
    wrong = []
    for notebook in sorted({e.notebook for e in find_exercises()}):
        exercises = [e for e in find_exercises() if e.notebook == notebook]
        code = [c.source for c in nbformat.read(os.path.join(REPO_DIR, notebook), as_version=4).cells
                if c.cell_type == "code"]
        switch = next((i for i, s in enumerate(code) if "USE_MY_CODE = False" in s), None)
        chapters = {e.chapter for e in exercises}
        if switch is None or not any(f"use_my_code(chapter={ch}, enabled=USE_MY_CODE)" in code[switch]
                                     for ch in chapters):
            wrong.append(f"{notebook}: no USE_MY_CODE switch for chapter {sorted(chapters)}")
            continue
        for i, source in enumerate(code[:switch]):
            for e in exercises:
                for name in e.stubbed:
                    if re.search(rf"^from {re.escape(e.module)} import .*\b{name}\b", source, re.M):
                        wrong.append(f"{notebook}: code cell {i} imports {name} before the switch")
    assert not wrong, wrong
