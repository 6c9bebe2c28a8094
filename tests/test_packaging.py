"""Packaging: environment.yml and pyproject.toml name the same dependencies; generated files and
stored references are current (the Makefile's test target also runs both checks as commands)."""
import os
import re
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _norm(req: str) -> str:
    return re.sub(r"\s+", "", req).lower()


def test_environment_yml_matches_pyproject():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        proj = tomllib.load(f)["project"]
    want = {_norm(r) for r in proj["dependencies"] + proj["optional-dependencies"]["dev"]}
    lines = open(os.path.join(ROOT, "environment.yml")).read().splitlines()
    pip_reqs = {_norm(line.strip()[2:]) for line in lines
                if line.startswith("      - ") and not line.strip().startswith("- -e")}
    assert pip_reqs == want, f"only in environment.yml: {pip_reqs - want}; only in pyproject: {want - pip_reqs}"


def test_exercise_markers_registered_in_pyproject():
    from minillm.course.exercises import find_exercises
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        markers = tomllib.load(f)["tool"]["pytest"]["ini_options"]["markers"]
    names = {m.split(":")[0] for m in markers}
    missing = [e.marker for e in find_exercises() if e.marker not in names]
    assert not missing, f"register these markers in pyproject.toml [tool.pytest.ini_options]: {missing}"


def test_generated_exercises_and_solutions_are_current():
    from minillm.course.exercises import write
    assert write(check=True) == [], "run `python -m minillm.course.exercises` (make exercises)"


def test_ci_runs_the_readme_test_command():
    ci = open(os.path.join(ROOT, ".ci", "run")).read()
    readme = open(os.path.join(ROOT, "README.md")).read()
    assert "make test" in ci and "make test" in readme and "make demo" in readme


def test_setup_off_linux_stops_at_once_and_says_why(tmp_path):
    """Triton publishes Linux wheels only: on macOS `make setup` used to fail inside pip ('No matching
    distribution found for triton'). It stops before creating anything and names the ways that work."""
    import subprocess
    venv = tmp_path / "venv"
    r = subprocess.run(["make", "-s", "setup", "OS_NAME=Darwin", f"VENV={venv}"], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode != 0 and not venv.exists(), r.stdout + r.stderr
    assert "minillm needs Linux (Darwin here)" in r.stdout and "WSL2" in r.stdout and "hosted notebook" in r.stdout


def test_setup_with_an_old_python_stops_at_once_and_says_which_to_name(tmp_path):
    """pyproject asks for Python 3.11+; pip refused an older one only at `pip install -e .`, after torch
    (several GB) was downloaded. make setup checks first and names the PYTHON= override."""
    import subprocess
    old = tmp_path / "python3.10"
    old.write_text("#!/bin/sh\n[ \"$1\" = --version ] && echo 'Python 3.10.12' && exit 0\nexit 1\n")
    old.chmod(0o755)
    venv = tmp_path / "venv"
    r = subprocess.run(["make", "-s", "setup", f"PYTHON={old}", f"VENV={venv}"], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode != 0 and not venv.exists(), r.stdout + r.stderr
    assert "needs Python 3.11 or newer" in r.stdout and "Python 3.10.12" in r.stdout, r.stdout
    assert "make setup PYTHON=python3.11" in r.stdout, r.stdout
