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


WARNING = ("/opt/torch/.venv/lib/python3.12/site-packages/tqdm/auto.py:21: TqdmWarning: IProgress not found. Please "
           "update jupyter and ipywidgets. See https://ipywidgets.readthedocs.io/en/stable/user_install.html\n"
           "  from .autonotebook import tqdm as notebook_tqdm\n")  # as a kernel without ipywidgets printed it


def _stderr(text):
    import nbformat
    return nbformat.v4.new_output("stream", name="stderr", text=text)


def test_tidy_drops_only_what_no_reader_should_keep():
    import nbformat

    from minillm.course.notebooks import tidy

    bar = "prefill: 100%|##########| 4/4 [00:01<00:00,  3.9it/s]\n"
    cells = [nbformat.v4.new_code_cell("from tqdm.auto import tqdm", outputs=[_stderr(WARNING)]),
             nbformat.v4.new_code_cell("run()", outputs=[_stderr(WARNING + bar), _stderr("[minillm] preparing\n")]),
             nbformat.v4.new_code_cell("check_answers('05', answers)", execution_count=7,
                                       outputs=[nbformat.v4.new_output("stream", name="stdout", text="0 of 6\n")]),
             nbformat.v4.new_code_cell("print(1)", outputs=[nbformat.v4.new_output("stream", name="stdout", text=WARNING)])]
    nb = nbformat.v4.new_notebook(cells=cells, metadata={"widgets": {"state": {}}})
    removed = tidy(nb)
    assert removed == ["cell 0: tqdm's no-ipywidgets warning", "cell 1: tqdm's no-ipywidgets warning",
                       "cell 2: the answers check's outputs", "widget state that no output shows"]
    assert nb.cells[0].outputs == []
    assert [o["text"] for o in nb.cells[1].outputs] == [bar, "[minillm] preparing\n"]  # the bar and the rest stay
    assert nb.cells[2].outputs == [] and nb.cells[2].execution_count is None
    assert nb.cells[3].outputs[0]["text"] == WARNING  # a program's own stdout is never touched
    assert tidy(nb) == []  # tidying twice changes nothing

    shown = nbformat.v4.new_output("display_data", data={"application/vnd.jupyter.widget-view+json": {"model_id": "m"},
                                                         "text/plain": "bar"})
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("bar", outputs=[shown])],
                                  metadata={"widgets": {"state": {"m": {}}}})
    assert tidy(nb) == [] and "widgets" in nb.metadata  # state a kept widget needs stays


def test_kept_notebooks_are_tidy():
    """What `run` keeps is tidy; a notebook executed some other way gets `python -m minillm.course.notebooks tidy`."""
    import nbformat

    from minillm.course.notebooks import tidy

    untidy = {os.path.basename(p): r for p in course_notebooks() if (r := tidy(nbformat.read(p, as_version=4)))}
    assert not untidy, f"{untidy}: run `python -m minillm.course.notebooks tidy notebooks/*.ipynb`"


def test_tidy_command(tmp_path, capsys):
    import nbformat
    import pytest

    from minillm.course import notebooks

    path = tmp_path / "99_scratch.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x", outputs=[_stderr(WARNING)])]), path)
    notebooks.main(["tidy", str(path)])
    assert capsys.readouterr().out == f"{path}: cell 0: tqdm's no-ipywidgets warning\n"
    assert nbformat.read(path, as_version=4).cells[0].outputs == []
    notebooks.main(["tidy", str(path)])
    assert capsys.readouterr().out == f"{path}: tidy\n"
    with pytest.raises(SystemExit) as exit_info:
        notebooks.main(["tidy", str(tmp_path / "missing.ipynb")])
    assert exit_info.value.code == 2 and "no such notebook" in capsys.readouterr().err
