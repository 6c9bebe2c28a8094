"""Imports only go down (README, "How it is built"): minillm/course/ sits beside the engine and may
import it; nothing outside minillm/course/ (the engine, the models, layers and kernels, the CLI, the
bench, the model zoo, the timers) imports minillm.course. Read from the source, nothing is imported."""
import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "minillm")
COURSE = os.path.join(PACKAGE, "course")
# must be among the checked files (a move into course/ or a rename would otherwise drop them silently)
MUST_CHECK = ["minillm/llm.py", "minillm/bench.py", "minillm/cli.py", "minillm/model_zoo.py", "minillm/timing.py",
              "minillm/distributed.py", "minillm/engine/tp.py", "minillm/engine/model_runner.py",
              "minillm/models/qwen3.py"]


def _imported(path: str, root: str = ROOT) -> set[str]:
    """Every module an import statement in the file names (function-level imports too), absolute."""
    here = os.path.relpath(path, root)[:-3].split(os.sep)
    package = here if path.endswith("__init__.py") else here[:-1]
    out = set()
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)  # `from minillm import course`
    return out


def _engine_files() -> list[str]:
    files = []
    for root, dirs, names in os.walk(PACKAGE):
        dirs[:] = [d for d in dirs if os.path.join(root, d) != COURSE and d != "__pycache__"]
        files += [os.path.join(root, n) for n in names if n.endswith(".py")]
    return sorted(files)


def test_nothing_outside_course_imports_course():
    files = _engine_files()
    rel = {os.path.relpath(f, ROOT).replace(os.sep, "/") for f in files}
    assert not [m for m in MUST_CHECK if m not in rel], f"not checked: {[m for m in MUST_CHECK if m not in rel]}"
    bad = {os.path.relpath(f, ROOT): sorted(m for m in _imported(f) if m == "minillm.course"
                                            or m.startswith("minillm.course."))
           for f in files}
    bad = {f: mods for f, mods in bad.items() if mods}
    assert not bad, f"minillm.course is imported outside minillm/course/ (move the helper out of course/): {bad}"


def test_the_check_sees_an_import_of_course(tmp_path):
    """The checker itself: each way of importing course is caught, relative imports included."""
    (tmp_path / "minillm" / "engine").mkdir(parents=True)
    probe = tmp_path / "minillm" / "engine" / "probe.py"
    for line in ["from minillm.course.ranks import run_on_ranks", "import minillm.course.tp_tools",
                 "from minillm import course", "def f():\n    from minillm.course import exercises",
                 "from ..course import timing", "from .. import course"]:
        probe.write_text(line + "\n")
        mods = _imported(str(probe), str(tmp_path))
        assert any(m == "minillm.course" or m.startswith("minillm.course.") for m in mods), (line, mods)
