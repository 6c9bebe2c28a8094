"""Exercises are marked regions of minillm's own source. This module finds them, writes
`exercises/chN.py` (stubs) and `solutions/chN.py` (complete), and swaps an implementation into the
running engine.

A region in a minillm module:

    # >>> exercise 2.1 | notebooks/02_decoder_layer.ipynb | 2. RMSNorm
    def rms_norm(x, weight, eps):
        \"\"\"What it computes, shapes, Hints: ...\"\"\"
        ...body...
    # <<< exercise 2.1

Every top-level function in a region becomes a stub that keeps its decorators, signature and
docstring and raises NotImplementedError naming the exercise and the notebook section; a function
whose `def` (or first decorator) is preceded by the line `# exercise: given` is copied whole.

    python -m minillm.course.exercises          # regenerate exercises/ and solutions/
    python -m minillm.course.exercises --check  # exit 1 if they differ from what would be written
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import functools
import hashlib
import importlib
import importlib.util
import os
import re
import sys
import types
from dataclasses import dataclass, field

PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO_DIR = os.path.dirname(PACKAGE_DIR)
BEGIN = re.compile(r"^# >>> exercise (\d+)\.(\d+) \| (\S+) \| (.+)$")
END = re.compile(r"^# <<< exercise (\d+)\.(\d+)$")
GIVEN = "# exercise: given"
# minillm/course/ modules that hold exercises: course material rather than engine code (chapter 1's
# runtime v0, the Triton primer's kernels); the rest of course/ is tooling and is not searched
COURSE_EXERCISE_MODULES = ("runtime_v0.py", "triton_primer.py")


@dataclass
class Exercise:
    chapter: int
    number: int
    module: str  # dotted name of the minillm module holding it
    notebook: str
    section: str
    functions: list[str]  # top-level names defined in the region, in order
    stubbed: list[str]  # the ones students write
    source: str = field(repr=False, default="")  # the region's code

    @property
    def id(self) -> str:
        return f"{self.chapter}.{self.number}"

    @property
    def marker(self) -> str:
        return f"ex{self.chapter}_{self.number}"

    def where(self) -> str:
        return f"{self.notebook}, section '{self.section}'"


def _module_name(path: str) -> str:
    rel = os.path.relpath(path, REPO_DIR)[:-3]
    return rel.replace(os.sep, ".").removesuffix(".__init__")


def find_exercises() -> list[Exercise]:
    """Every exercise region in minillm/, sorted by id. Of minillm/course/ (the course's tooling,
    whose docstrings show region markers as examples) only COURSE_EXERCISE_MODULES are read."""
    found = []
    for root, _, files in os.walk(PACKAGE_DIR):
        in_course = os.path.basename(root) == "course"
        for fname in sorted(files):
            if fname.endswith(".py") and (not in_course or fname in COURSE_EXERCISE_MODULES):
                found.extend(_parse_file(os.path.join(root, fname)))
    found.sort(key=lambda e: (e.chapter, e.number))
    ids = [e.id for e in found]
    dupes = {i for i in ids if ids.count(i) > 1}
    if dupes:
        raise ValueError(f"exercise ids used twice: {sorted(dupes)}")
    names = [n for e in found for n in e.functions]
    clash = {n for n in names if names.count(n) > 1}
    if clash:
        raise ValueError(f"exercise function names must be unique across the course: {sorted(clash)}")
    return found


def _parse_file(path: str) -> list[Exercise]:
    lines = open(path).read().splitlines()
    out, i = [], 0
    while i < len(lines):
        m = BEGIN.match(lines[i])
        if not m:
            if END.match(lines[i]):
                raise ValueError(f"{path}:{i + 1}: '# <<< exercise' without a matching '# >>> exercise'")
            i += 1
            continue
        ch, num, notebook, section = int(m[1]), int(m[2]), m[3], m[4].strip()
        j = i + 1
        while j < len(lines) and not END.match(lines[j]):
            if BEGIN.match(lines[j]):
                raise ValueError(f"{path}:{j + 1}: exercise regions cannot nest")
            j += 1
        if j == len(lines) or END.match(lines[j]).groups() != m.groups()[:2]:
            raise ValueError(f"{path}:{i + 1}: exercise {ch}.{num} has no matching '# <<< exercise {ch}.{num}'")
        source = "\n".join(lines[i + 1:j]) + "\n"
        tree = ast.parse(source)
        funcs = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
        if not funcs:
            raise ValueError(f"{path}:{i + 1}: exercise {ch}.{num} holds no function")
        src_lines = source.splitlines()
        stubbed = []
        for f in funcs:
            first = min([f.lineno] + [d.lineno for d in f.decorator_list])
            if not (first >= 2 and src_lines[first - 2].strip() == GIVEN):
                stubbed.append(f.name)
        out.append(Exercise(ch, num, _module_name(path), notebook, section,
                            [f.name for f in funcs], stubbed, source))
        i = j + 1
    return out


# ---- writing exercises/ and solutions/ ------------------------------------------------------------
def _stub(ex: Exercise) -> str:
    """The region with each stubbed function's body replaced by a NotImplementedError."""
    tree = ast.parse(ex.source)
    lines = ex.source.splitlines()
    for f in reversed([n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in ex.stubbed]):
        body = f.body
        has_doc = isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
            and isinstance(body[0].value.value, str)
        keep_until = body[0].end_lineno if has_doc else f.body[0].lineno - 1
        indent = " " * (f.col_offset + 4)
        msg = f"Exercise {ex.id}: implement {f.name} in exercises/ch{ex.chapter}.py (see {ex.where()})"
        new = [f"{indent}raise NotImplementedError({msg!r})"]
        lines[keep_until:f.end_lineno] = new
    return "\n".join(lines) + "\n"


def _imports_for(exs: list[Exercise], defined: set[str]) -> list[str]:
    """Import lines for the free names the regions use, taken from their source modules."""
    out: list[str] = []
    for ex in exs:
        mod_path = os.path.join(REPO_DIR, *ex.module.split(".")) + ".py"
        mod_tree = ast.parse(open(mod_path).read())
        import_of: dict[str, str] = {}
        module_level: set[str] = set()
        for node in mod_tree.body:
            if isinstance(node, ast.Import):
                for a in node.names:
                    import_of[(a.asname or a.name).split(".")[0]] = (
                        f"import {a.name}" + (f" as {a.asname}" if a.asname else ""))
            elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
                base = node.module if node.level == 0 else _resolve_relative(ex.module, node)
                for a in node.names:
                    import_of[a.asname or a.name] = f"from {base} import {a.name}" + (
                        f" as {a.asname}" if a.asname else "")
            elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                module_level.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                module_level.update(t.id for t in targets if isinstance(t, ast.Name))
        used = {n.id for n in ast.walk(ast.parse(ex.source)) if isinstance(n, ast.Name)}
        for name in sorted(used - defined):
            if name in import_of:
                line = import_of[name]
            elif name in module_level:
                line = f"from {ex.module} import {name}"
            else:
                continue  # a builtin or a local name
            if line not in out:
                out.append(line)
    return sorted(out, key=lambda s: (not s.startswith("import "), s))


def _resolve_relative(module: str, node: ast.ImportFrom) -> str:
    parts = module.split(".")[:-node.level]
    return ".".join(parts + ([node.module] if node.module else []))


def render_chapter(chapter: int, exs: list[Exercise], stubs: bool) -> str:
    kind = "exercise stubs" if stubs else "solutions"
    defined = {n for e in exs for n in e.functions}
    if stubs:  # the students' file: theirs to fill in; only the generator's own edits are maintainers'
        head = [f'"""Chapter {chapter} exercises: YOUR file. Fill in the bodies below, then grade one exercise with']
    else:
        head = [f'"""Chapter {chapter} {kind}. GENERATED from minillm/ by `python -m minillm.course.exercises`:',
                "do not edit by hand."]
    if stubs:
        head.append(f"    make grade EX={exs[0].id}            (or: pytest tests/exercises -m {exs[0].marker})")
        head.append("(Generated from minillm/ by `make exercises`, which refuses to overwrite a file holding your code.)")
    head.append("")
    for e in exs:
        head.append(f"Exercise {e.id}: {', '.join(e.stubbed)}  ({e.where()})")
    head.append('"""')
    imports = _imports_for(exs, defined)
    if any(line.split()[1].startswith("triton") for line in imports):
        # Triton reads TRITON_INTERPRET when triton.language is imported: minillm.kernels sets it first
        imports.insert(0, "import minillm.kernels  # noqa: F401,I001  (sets TRITON_INTERPRET=1 without CUDA)")
    body = ["from __future__ import annotations", "", *imports, ""]
    for e in exs:
        body += ["", f"# ---- Exercise {e.id} ({e.where()}), from {e.module} ----",
                 (_stub(e) if stubs else e.source).rstrip("\n"), ""]
    return "\n".join(head + body).rstrip("\n") + "\n"


def generated_files() -> dict[str, str]:
    """relative path -> content of every file the generator owns."""
    exs = find_exercises()
    files = {}
    for folder, stubs in (("exercises", True), ("solutions", False)):
        files[f"{folder}/__init__.py"] = f'"""{folder.capitalize()} of the minillm course (generated)."""\n'
        for ch in sorted({e.chapter for e in exs}):
            files[f"{folder}/ch{ch}.py"] = render_chapter(ch, [e for e in exs if e.chapter == ch], stubs)
    return files


def open_or_none(rel: str) -> str | None:
    """A repository file's text, or None when it does not exist."""
    path = os.path.join(REPO_DIR, rel)
    return open(path).read() if os.path.exists(path) else None


def students_work(source: str) -> list[str]:
    """The exercise functions an exercises/chN.py source defines with a body of its own (not the stub's
    raise NotImplementedError); a file Python cannot parse is someone's work in progress: ['(all)']."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return ["(all: the file does not parse)"]
    stubbed = {f for e in find_exercises() for f in e.stubbed}
    return [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in stubbed
            and not _is_stub_body(n)]


def students_files(rels) -> dict[str, list[str]]:
    """Of these repository paths, the exercises/ files that hold a student's code -> its functions."""
    found = {}
    for rel in rels:
        path = os.path.join(REPO_DIR, rel)
        if rel.startswith("exercises/") and os.path.exists(path):
            names = students_work(open(path).read())
            if names:
                found[rel] = names
    return found


def listed(files: dict[str, list[str]]) -> str:
    """students_files' result, readable: 'exercises/ch3.py: slot_mapping_for; ...'."""
    return "; ".join(f"{rel}: {', '.join(names)}" for rel, names in files.items())


def write(check: bool = False, force: bool = False) -> list[str]:
    """Write (or, with check, compare) the generated files. -> the paths that differ(ed). An exercises/
    file holding a student's code is not overwritten unless force: ValueError naming the functions."""
    differ = []
    want = generated_files()
    kept = students_files(rel for rel in want if open_or_none(rel) != want[rel])
    if kept and not check and not force:
        raise ValueError(f"exercises/ holds your code ({listed(kept)}): regenerating the stubs would overwrite it. "
                         f"Copy it somewhere first (cp -r exercises my_exercises), or regenerate anyway with "
                         f"`python -m minillm.course.exercises --force`")
    for rel, content in want.items():
        path = os.path.join(REPO_DIR, rel)
        if open_or_none(rel) != content:
            differ.append(rel)
            if not check:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "w") as f:
                    f.write(content)
    for folder in ("exercises", "solutions"):  # chapter files whose exercises are gone
        for fname in sorted(os.listdir(os.path.join(REPO_DIR, folder))) if os.path.isdir(
                os.path.join(REPO_DIR, folder)) else []:
            rel = f"{folder}/{fname}"
            if fname.endswith(".py") and rel not in want:
                differ.append(rel)
                if not check:
                    os.remove(os.path.join(REPO_DIR, rel))
    return differ


# ---- choosing the implementation under test -------------------------------------------------------
IMPLS = ("ref", "solutions", "exercises")
DEFAULT_IMPL = "exercises"  # what a student's plain `pytest tests/exercises` grades: their own code


def impl_files(impl: str) -> list[str]:
    """The files an implementation's exercise functions come from (relative to the repository)."""
    if impl == "ref":
        return sorted({e.module.replace(".", "/") + ".py" for e in find_exercises()})
    return [f"{impl}/ch{ch}.py" for ch in sorted({e.chapter for e in find_exercises()})]


def load_impl(impl: str, chapters: set[int] | None = None) -> types.SimpleNamespace:
    """A namespace of every exercise function (of `chapters`, default all), taken from minillm (ref)
    or the generated files. A chapter file that does not import (a student's typo, a missing module)
    fails only its own exercises: each of its functions raises, when called, an ImportError whose
    cause is the file's own error, so the other chapters still grade and run."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    ns = {}
    exs = find_exercises()
    for ch in sorted({e.chapter for e in exs if chapters is None or e.chapter in chapters}):
        names = [n for e in exs if e.chapter == ch for n in e.functions]
        if impl == "ref":
            for e in (e for e in exs if e.chapter == ch):
                mod = importlib.import_module(e.module)
                ns.update({n: getattr(mod, n) for n in e.functions})
            continue
        path = f"{impl}/ch{ch}.py"
        try:
            mod = _import_generated(impl, ch)
        except Exception as err:  # noqa: BLE001 - the student's module code, whatever it raised
            ns.update({n: _failing(n, f"{path} does not import, so {n} cannot run: {type(err).__name__}: {err}",
                                   err) for n in names})
            continue
        for n in names:
            ns[n] = getattr(mod, n, None) or _failing(
                n, f"{path} defines no function {n}: put back its def line (the stub's is in git: "
                   f"git show HEAD:{path})", None)
    return types.SimpleNamespace(**ns)


def _failing(name: str, message: str, cause: BaseException | None):
    """A stand-in for an exercise function that cannot run: calling it raises ImportError(message)."""
    def fail(*args, **kwargs):
        raise ImportError(message) from cause
    fail.__name__ = fail.__qualname__ = name
    return fail


_IMPORTED: dict[str, str] = {}  # generated module name -> sha256 of the source it was executed from


def _import_generated(impl: str, chapter: int):
    """exercises/chN.py (or solutions/) as module `impl.chN`, executed again whenever the file has
    changed since: a notebook's switch re-run after an edit must run the edited code, not the copy
    imported the first time. A file that fails to import is not kept, so the next call tries again."""
    name = f"{impl}.ch{chapter}"
    path = os.path.join(REPO_DIR, impl, f"ch{chapter}.py")
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    if name in sys.modules and _IMPORTED.get(name) == digest:
        return sys.modules[name]
    if REPO_DIR not in sys.path:  # `impl.chN` importable by name: a process spawned from here (run_on_ranks)
        sys.path.append(REPO_DIR)  # unpickles its functions by importing it
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # before running it: its own code (dataclasses, pickling by name) looks itself up
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        sys.modules.pop(name, None)
        _IMPORTED.pop(name, None)
        raise
    _IMPORTED[name] = digest
    return mod


def _is_stub_body(fn: ast.FunctionDef) -> bool:
    """True when a function's body, after its docstring, is only `raise NotImplementedError(...)`."""
    body = fn.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    if len(body) != 1 or not isinstance(body[0], ast.Raise) or body[0].exc is None:
        return False
    exc = body[0].exc.func if isinstance(body[0].exc, ast.Call) else body[0].exc
    return isinstance(exc, ast.Name) and exc.id == "NotImplementedError"


def unsolved(impl: str, chapters: set[int] | None = None) -> dict[str, list[str]]:
    """exercise id -> the functions a student still has to write (their body is still the stub's
    `raise NotImplementedError`), read from the files (of `chapters`, default all) without running
    them. Empty for ref. A file with a syntax error raises ValueError naming its line."""
    if impl == "ref":
        return {}
    out: dict[str, list[str]] = {}
    for ch in sorted({e.chapter for e in find_exercises() if chapters is None or e.chapter in chapters}):
        path = os.path.join(REPO_DIR, impl, f"ch{ch}.py")
        try:
            tree = ast.parse(open(path).read(), filename=path)
        except SyntaxError as e:  # a student's file mid-edit: say where, not a parser traceback
            raise ValueError(f"{impl}/ch{ch}.py, line {e.lineno}: {e.msg} (a syntax error: fix it, then run again)"
                             f"\n    {(e.text or '').strip()}") from None
        stubs = {n.name for n in tree.body if isinstance(n, ast.FunctionDef) and _is_stub_body(n)}
        for e in find_exercises():
            if e.chapter == ch:
                todo = [f for f in e.stubbed if f in stubs]
                if todo:
                    out[e.id] = todo
    return out


def status(impl: str, exercise_id: str) -> str:
    """'not started' (every function still a stub), 'started' (some written) or 'written' (all)."""
    todo = unsolved(impl, {exercise(exercise_id).chapter}).get(exercise_id, [])
    if not todo:
        return "written"
    return "not started" if len(todo) == len(exercise(exercise_id).stubbed) else "started"


@dataclass
class Swap:
    """Exercise functions swapped into the running engine (see swap_in); restore() undoes it."""

    impl: str
    swapped: list[str]  # exercise ids whose written functions now run in the engine
    fallback: list[str]  # exercise ids left on minillm's reference (not started)
    written: dict[str, list[str]] = field(default_factory=dict)  # exercise id -> its functions swapped in
    patched: list[tuple[object, str, object, object]] = field(default_factory=list, repr=False)  # module, name, ref, new
    # while swapped in under Triton's interpreter: kernel_bounds' check, so a student's kernel that stores
    # outside its tensor raises at its line instead of corrupting (and later killing) the notebook's kernel
    bounds_check: contextlib.ExitStack = field(default_factory=contextlib.ExitStack, repr=False)
    # while swapped in: the same swap, for the tensor-parallel workers spawned meanwhile (in tp.WORKER_SETUP)
    in_workers: functools.partial | None = field(default=None, repr=False)

    def restore(self) -> None:
        self.bounds_check.close()
        if self.in_workers is not None:
            from minillm.engine import tp
            if self.in_workers in tp.WORKER_SETUP:
                tp.WORKER_SETUP.remove(self.in_workers)
            self.in_workers = None
        for mod, name, ref, _ in reversed(self.patched):
            setattr(mod, name, ref)
        # a module imported while the swap was on copied a swapped function: put the reference back there too
        swapped = {name: (new, ref) for _, name, ref, new in self.patched}
        for key, mod in list(sys.modules.items()):
            if key.startswith("minillm") and mod is not None:
                for name, (new, ref) in swapped.items():
                    if getattr(mod, name, None) is new:
                        setattr(mod, name, ref)
        self.patched.clear()

    def reference(self, name: str):
        """minillm's own function `name` (an exercise function), whether or not yours replaced it."""
        for _, patched_name, ref, _ in self.patched:
            if patched_name == name:
                return ref
        owner = next(e for e in find_exercises() if name in e.functions)
        return getattr(importlib.import_module(owner.module), name)

    def suspect(self, ok: bool, *exercise_ids: str) -> None:
        """A notebook's check just ran; when it failed and any of these exercises runs your code, say so
        and how to grade them (a wrong result there is most likely yours, not the kernel's or the
        engine's under test). Prints nothing when the check passed or none of them is yours."""
        mine = [i for i in exercise_ids if i in self.swapped]
        if ok or self.impl != "exercises" or not mine:
            return
        names = ", ".join(f"{i} {'/'.join(self.written[i])}" for i in mine)
        print(f"-> this check failed, and it ran your code for {names} (USE_MY_CODE = True): "
              f"make grade EX={mine[0]} names what is wrong")

    def describe(self) -> str:
        """Which code runs: per exercise, the functions swapped in; a partly written exercise also
        names the functions of it that still run minillm's reference."""
        def swapped(i: str) -> str:
            mine = self.written.get(i, exercise(i).stubbed)
            rest = [f for f in exercise(i).stubbed if f not in mine]
            return f"{i} {'/'.join(mine)}" + (f" ({'/'.join(rest)} not written yet: minillm's runs)" if rest else "")
        src = {"ref": "minillm itself", "solutions": "solutions/", "exercises": "your code (exercises/)"}[self.impl]
        fallback = ", ".join(f"{i} {'/'.join(exercise(i).stubbed)}" for i in self.fallback) or "none"
        text = (f"running {src} for: {', '.join(swapped(i) for i in self.swapped) or 'none'}\n"
                f"running minillm's reference for (not started): {fallback}")
        if self.impl == "exercises" and self.swapped:  # a wrong one runs here as readily as a right one
            text += f"\ncheck yours first: make grade EX={self.swapped[0]} (one exercise) or make grade (all)"
        return text


def swap_in(impl: str, exercises: set[str] | None = None, chapters: set[int] | None = None) -> Swap:
    """Put `impl`'s exercise functions into every minillm module that holds the reference
    function under its name, so the running engine calls them. Only the functions a student has
    written are swapped: a stub still raising NotImplementedError leaves minillm's own function in
    place, so one solved exercise runs in the engine while the rest are not started.
    exercises: ids to swap (default all); chapters: restrict to these chapters. Tensor-parallel workers
    spawned while it is on run the same swap (tp.WORKER_SETUP)."""
    from minillm.engine import tp  # imported first, so its modules are among those patched below
    wanted = {e.chapter for e in find_exercises()
              if (chapters is None or e.chapter in chapters) and (exercises is None or e.id in exercises)}
    chosen, todo = load_impl(impl, wanted), unsolved(impl, wanted)  # only those files: another chapter's
    swap = Swap(impl, [], [])                                          # broken file does not matter here
    modules = [m for k, m in list(sys.modules.items()) if k.startswith("minillm") and m is not None]
    for e in find_exercises():
        if (chapters is not None and e.chapter not in chapters) or (exercises is not None and e.id not in exercises):
            continue
        written = [n for n in e.stubbed if n not in todo.get(e.id, [])]
        (swap.swapped if written else swap.fallback).append(e.id)
        if written:
            swap.written[e.id] = written
        ref_mod = importlib.import_module(e.module)
        if ref_mod not in modules:
            modules.append(ref_mod)
        for name in written:
            ref = getattr(ref_mod, name)
            for mod in modules:
                if getattr(mod, name, None) is ref:
                    swap.patched.append((mod, name, ref, getattr(chosen, name)))
                    setattr(mod, name, getattr(chosen, name))
    if swap.patched and os.environ.get("TRITON_INTERPRET") == "1":
        from minillm.course.kernel_bounds import checked_bounds
        swap.bounds_check.enter_context(checked_bounds())
    if swap.patched:  # a tensor-parallel engine's other ranks are processes of their own: swap there too
        swap.in_workers = functools.partial(swap_in, impl, exercises, chapters)
        tp.WORKER_SETUP.append(swap.in_workers)
    return swap


@contextlib.contextmanager
def use_impl(impl: str, chapters: set[int] | None = None, exercises: set[str] | None = None):
    """swap_in(...) for the duration of a with-block. -> the Swap."""
    swap = swap_in(impl, exercises=exercises, chapters=chapters)
    try:
        yield swap
    finally:
        swap.restore()


_NOTEBOOK_SWAP: Swap | None = None


def use_my_code(chapter: int, enabled: bool, impl: str = DEFAULT_IMPL) -> Swap:
    """A notebook's switch (`USE_MY_CODE = True`): from now on the engine runs the chapter's exercises
    that are written in exercises/chN.py, and minillm's reference for the others; False restores
    the reference (and returns a Swap of nothing, whose suspect() never speaks). Safe to re-run.
    Prints which code runs."""
    global _NOTEBOOK_SWAP
    if _NOTEBOOK_SWAP is not None:
        _NOTEBOOK_SWAP.restore()
        _NOTEBOOK_SWAP = None
    if not enabled:
        print(f"USE_MY_CODE = False: chapter {chapter} runs minillm's reference code "
              f"(set it to True to run your exercises/ch{chapter}.py in the engine)")
        return Swap("ref", [], [])
    _NOTEBOOK_SWAP = swap_in(impl, chapters={chapter})
    print(f"USE_MY_CODE = True: chapter {chapter}, " + _NOTEBOOK_SWAP.describe())
    return _NOTEBOOK_SWAP


def exercise(exercise_id: str) -> Exercise:
    for e in find_exercises():
        if e.id == exercise_id:
            return e
    raise ValueError(f"no exercise {exercise_id!r}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m minillm.course.exercises", description=__doc__.split("\n")[0])
    p.add_argument("--check", action="store_true", help="exit 1 if exercises/ or solutions/ are stale")
    p.add_argument("--force", action="store_true", help="overwrite exercises/ even where it holds a student's code")
    args = p.parse_args(argv)
    try:
        differ = write(check=args.check, force=args.force)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    if args.check and differ:
        yours = students_files(differ)
        if yours:  # a student's checkout: make test is CI's command, for the repository's own stubs
            print(f"exercises/ holds your code ({listed(yours)}): make test checks the repository's untouched "
                  f"stubs, as CI does, and stops here. Grade your code with make grade (make grade EX=N.M for "
                  f"one exercise)")
        rest = [rel for rel in differ if rel not in yours]
        if rest:
            print("stale generated files (run `python -m minillm.course.exercises`): " + ", ".join(rest))
        sys.exit(1)
    print(("up to date" if args.check else f"wrote {len(differ)} file(s)") +
          f"; {len(find_exercises())} exercises")


if __name__ == "__main__":
    main()
