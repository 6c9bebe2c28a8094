"""Notebook provenance: every notebook records the machine that produced its outputs, and the README's
"where the outputs come from" table is exactly what that metadata says."""
import os

from minillm.course.notebooks import BEGIN, NOTEBOOKS, course_notebooks, provenance, readme_table, table


def test_every_notebook_records_its_device():
    assert course_notebooks(), f"no course notebooks found in {NOTEBOOKS}"
    missing = [os.path.basename(p) for p in course_notebooks() if not (provenance(p) or {}).get("device")]
    assert not missing, (f"notebooks without a recorded device: {missing}; execute them with "
                         f"`python -m minillm.course.notebooks run <notebook>` on the machine whose outputs you keep")


def test_readme_table_matches_the_notebooks():
    assert readme_table() is not None, f"README.md lacks the provenance table (its first line is {BEGIN!r})"
    assert readme_table() == table(), ("README.md's provenance table differs from the notebooks' metadata; "
                                       "paste the output of `python -m minillm.course.notebooks table`")
