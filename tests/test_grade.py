"""The student's grading path, end to end: `make grade` / `python -m minillm.course.grade` and a plain
`pytest tests/exercises` grade the student's own exercises/, an exercise still raising its stub's
NotImplementedError is "not started", and a solved exercise runs in the engine on its own.

The solved-exercise cases run in a copy of the repository (the real exercises/ stays untouched),
with that copy first on PYTHONPATH."""
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from minillm.course.exercises import REPO_DIR, find_exercises, students_work
from minillm.course.grade import gradescope_json, grade

ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # the subprocesses run tiny models


def _function_source(path: str, name: str) -> str:
    """A top-level function of a generated file, from its `def` to the next top-level block."""
    text = open(path).read()
    m = re.search(rf"\ndef {name}\(.*?(?=\n\n\n|\n# ----)", text, re.S)
    assert m, f"{name} not found in {path}"
    return m.group(0)


def _copy_repo(root) -> str:
    """The repository's tracked files, copied into root."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO_DIR, capture_output=True, check=True).stdout
    for rel in filter(None, files.decode().split("\0")):
        if os.path.exists(os.path.join(REPO_DIR, rel)):
            os.makedirs(os.path.join(root, os.path.dirname(rel)), exist_ok=True)
            shutil.copy2(os.path.join(REPO_DIR, rel), os.path.join(root, rel))
    return str(root)


def _write_function(root: str, chapter: int, name: str, source: str) -> None:
    """Replace exercise function `name` in root's exercises/chN.py by `source`."""
    stub = os.path.join(root, "exercises", f"ch{chapter}.py")
    text = open(stub).read().replace(_function_source(stub, name), source)
    with open(stub, "w") as f:
        f.write(text)


@pytest.fixture(scope="module")
def repo_copy(tmp_path_factory):
    """The repository's tracked files, copied; exercise 3.1 solved in its exercises/ch3.py."""
    root = _copy_repo(tmp_path_factory.mktemp("repo"))
    _write_function(root, 3, "slot_mapping_for", _function_source(os.path.join(root, "solutions", "ch3.py"),
                                                                  "slot_mapping_for"))
    return root


def run_in(root: str, *args: str, timeout: float = 600, **extra_env: str) -> subprocess.CompletedProcess:
    # root first (its minillm and exercises), then what the caller's path had (a GPU machine's carried wheels)
    env = {**os.environ, **ONE_THREAD, **extra_env,
           "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    env.pop("MINILLM_IMPL", None)
    return subprocess.run([sys.executable, *args], cwd=root, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_untouched_stubs_are_all_not_started():
    results = grade("exercises")
    assert [r.id for r in results] == [e.id for e in find_exercises()]
    assert {r.status for r in results} == {"not started"}
    assert all("still raise NotImplementedError" in r.message for r in results)
    report = gradescope_json(results)
    assert report["score"] == 0 and report["max_score"] == len(results)
    assert all(t["status"] == "failed" and t["score"] == 0 for t in report["tests"])


def test_make_grade_on_the_stubs_exits_nonzero_and_writes_the_json(tmp_path):
    out = tmp_path / "results.json"
    r = run_in(REPO_DIR, "-m", "minillm.course.grade", "--json", str(out))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "0 passed, 0 failed, 23 not started" in r.stdout.replace(str(len(find_exercises())), "23")
    assert len(json.loads(out.read_text())["tests"]) == len(find_exercises())


def test_a_plain_pytest_grades_the_students_stub_and_names_its_file():
    r = run_in(REPO_DIR, "-m", "pytest", "tests/exercises", "-m", "ex3_2", "-q", "-p", "no:cacheprovider")
    assert r.returncode != 0, "a plain pytest on an unsolved exercise must fail"
    assert "--impl=exercises (your code)" in r.stdout
    assert "implement compute_block_hash in exercises/ch3.py" in r.stdout


def test_only_the_solved_exercise_passes_and_the_rest_are_not_started(repo_copy):
    r = run_in(repo_copy, "-m", "minillm.course.grade")
    assert r.returncode == 1, r.stdout + r.stderr  # 22 exercises are not started
    rows = {line.split()[0]: line for line in r.stdout.splitlines() if re.match(r"\d\.\d ", line)}
    assert "passed" in rows["3.1"] and "5/5" in rows["3.1"], rows["3.1"]  # 3.1's five graded tests
    assert all("not started" in row for ex, row in rows.items() if ex != "3.1"), r.stdout
    one = run_in(repo_copy, "-m", "minillm.course.grade", "--exercise", "3.1")
    assert one.returncode == 0 and "1 passed, 0 failed, 0 not started (of 1)" in one.stdout, one.stdout + one.stderr


def test_the_solved_exercise_alone_runs_in_the_engine(repo_copy):
    """3.1's engine test (prefix-cache hits included) passes with only 3.1 written: the engine falls
    back to minillm's reference for every other exercise."""
    r = run_in(repo_copy, "-m", "pytest", "tests/exercises/test_ch3.py", "-k", "engine", "-m", "ex3_1", "-q",
               "-p", "no:cacheprovider")
    assert r.returncode == 0 and "passed" in r.stdout, r.stdout[-3000:] + r.stderr[-2000:]


def test_regenerating_the_stubs_never_overwrites_a_students_code(tmp_path):
    """`make exercises` (a maintainer's command a student may run by mistake) refuses while exercises/ holds
    written functions, names them, and changes nothing; --force regenerates; the stubs themselves regenerate."""
    root = _copy_repo(tmp_path)
    mine = _function_source(os.path.join(root, "solutions", "ch3.py"), "slot_mapping_for")
    _write_function(root, 3, "slot_mapping_for", mine)
    before = open(os.path.join(root, "exercises", "ch3.py")).read()
    p = run_in(root, "-m", "minillm.course.exercises", timeout=300)
    assert p.returncode == 2 and "exercises/ch3.py: slot_mapping_for" in p.stderr and "--force" in p.stderr, p.stderr
    assert open(os.path.join(root, "exercises", "ch3.py")).read() == before
    p = run_in(root, "-m", "minillm.course.exercises", "--check", timeout=300)  # make test's first step
    assert p.returncode == 1 and "exercises/ch3.py: slot_mapping_for" in p.stdout and "make grade" in p.stdout, p.stdout
    assert "stale generated files" not in p.stdout, p.stdout
    p = run_in(root, "-m", "minillm.course.exercises", "--force", timeout=300)
    assert p.returncode == 0, p.stderr
    assert students_work(open(os.path.join(root, "exercises", "ch3.py")).read()) == []
    p = run_in(root, "-m", "minillm.course.exercises", timeout=300)  # only stubs now: nothing to refuse
    assert p.returncode == 0 and "wrote 0 file(s)" in p.stdout, p.stdout + p.stderr


def test_a_crash_or_an_endless_loop_names_the_students_line_and_the_notebook_section(tmp_path):
    """An exercise that raises (not a failed check) is reported with the line of the student's file that
    raised, also through Triton's interpreter, which raises its own error from the kernel's; one that never
    returns fails at the time limit with the line it was running, and its exercise's other tests are
    skipped (make grade captures pytest's output: an endless loop would hang it without a word)."""
    import time
    root = _copy_repo(tmp_path)
    _write_function(root, 1, "bpe_encode", (
        "\ndef bpe_encode(piece, ranks):\n"
        "    ids = []\n"
        "    while len(ids) < len(piece):  # never appends: an endless loop\n"
        "        pass\n"
        "    return ids"))
    _write_function(root, 2, "add_kernel", (
        "\ndef add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):\n"
        "    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)\n"
        "    x = tl.load(x_ptr + offs, mask=offs < n)\n"
        "    y = tl.load(y_ptr + offs[:, None], mask=offs[:, None] < n)  # a stray [:, None]\n"
        "    tl.store(out_ptr + offs, x + y, mask=offs < n)"))
    _write_function(root, 3, "slot_mapping_for", (
        "\ndef slot_mapping_for(block_table, start, end, block_size):\n"
        "    positions = np.arange(start, end)\n"
        "    return block_table[positions // block_size] * block_size + positions % blocksize  # a typo"))
    lines = open(os.path.join(root, "exercises", "ch3.py")).read().splitlines()
    crash_line = next(i for i, line in enumerate(lines, 1) if "% blocksize" in line)
    t0 = time.perf_counter()
    r = run_in(root, "-m", "minillm.course.grade", "--timeout", "2")  # the three written exercises run
    took = time.perf_counter() - t0
    assert r.returncode == 1, r.stdout + r.stderr
    assert "did not finish within 2 s (an endless loop?)" in r.stdout, r.stdout
    assert "still running exercises/ch1.py:" in r.stdout and "in bpe_encode: while len(ids)" in r.stdout, r.stdout
    assert took < 90, f"one timeout should end an exercise's grading: the run took {took:.0f} s"
    rows = {line.split()[0]: line for line in r.stdout.splitlines()
            if re.match(r"\d\.\d+ ", line) and "first failure" not in line}
    assert all(" failed " in rows[ex] and " 0/" in rows[ex] for ex in ("1.1", "2.7", "3.1")), r.stdout
    # a plain pytest has the same limit (MINILLM_TEST_TIMEOUT_S, default 120 s): the loop fails, it does not hang
    plain = run_in(root, "-m", "pytest", "tests/exercises", "-m", "ex1_1", "-x", "-q", "-p", "no:cacheprovider",
                   MINILLM_TEST_TIMEOUT_S="2")
    assert plain.returncode == 1 and "Timeout" in plain.stdout, plain.stdout[-3000:]
    assert "while len(ids) < len(piece)" in plain.stdout, plain.stdout[-3000:]
    assert "NameError" in r.stdout and f"raised at exercises/ch3.py:{crash_line} in slot_mapping_for: " in r.stdout
    assert "positions % blocksize" in r.stdout and "-- see notebooks/03_paged_kv_cache.ipynb" in r.stdout
    assert "raised at exercises/ch2.py:" in r.stdout and "in add_kernel: " in r.stdout, r.stdout
    assert "-- see notebooks/02a_triton_primer.ipynb" in r.stdout, r.stdout


def test_a_crash_inside_a_graded_call_names_the_students_line(tmp_path):
    """A test that grades what a call did, its error included (outcome(): a known bug may raise the same),
    still shows the line of the student's file that raised, and says the code raised: 3.3 without
    clamping the block table's -1 padding reads past the cache (IndexError)."""
    root = _copy_repo(tmp_path)
    source = _function_source(os.path.join(root, "solutions", "ch3.py"), "paged_decode_torch")
    assert source.count(".clamp_min(0)") == 1
    _write_function(root, 3, "paged_decode_torch", source.replace(".clamp_min(0)", ""))
    r = run_in(root, "-m", "minillm.course.grade", "--exercise", "3.3")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "your code raised IndexError" in r.stdout, r.stdout
    assert re.search(r"raised at exercises/ch3\.py:\d+ in paged_decode_torch: ", r.stdout), r.stdout


def test_a_crash_on_a_thread_rank_names_the_students_line(tmp_path):
    """Chapter 4's thread-rank tests fail a rank's error with a check (which names the known bug that raises the
    same errors), raised from that error: make grade used to drop the line that raised, which only a crash
    that was not a failed check got."""
    root = _copy_repo(tmp_path)
    _write_function(root, 4, "vocab_parallel_embed", (
        "\ndef vocab_parallel_embed(token_ids, weight_shard, vocab_start, group):\n"
        "    local = token_ids - vocab_start\n"
        "    mask = (local >= 0) & (local < weight_shard.shape[0])\n"
        "    y = torch.zeros(token_ids.shape[0], weight_shard.shape[1])  # float32, whatever the shard's dtype\n"
        "    y[mask] = weight_shard[local[mask]]\n"
        "    dist.all_reduce(y, group=group)\n"
        "    return y"))
    lines = open(os.path.join(root, "exercises", "ch4.py")).read().splitlines()
    crash_line = next(i for i, line in enumerate(lines, 1) if "y[mask] = weight_shard[local[mask]]" in line)
    r = run_in(root, "-m", "minillm.course.grade", "--exercise", "4.3")
    assert r.returncode == 1, r.stdout + r.stderr
    board = r.stdout[r.stdout.index("first failure"):]
    assert "what vocab_parallel_embed did on 2 ranks is wrong." in board, r.stdout
    assert (f"raised at exercises/ch4.py:{crash_line} in vocab_parallel_embed: y[mask] = weight_shard[local[mask]]"
            in board), r.stdout
    assert "Index put requires the source and destination dtypes match" in board, r.stdout  # the error itself
    assert "traceback is above" not in r.stdout, r.stdout  # make grade shows none


def test_a_test_that_kills_the_process_fails_its_exercise_and_the_rest_still_grade(tmp_path):
    """A kernel storing outside its tensor under Triton's interpreter wrote into the grader's own memory and
    killed it later, elsewhere (SIGABRT or SIGSEGV in check_close), with no scoreboard. Now such a store
    raises at the kernel's line; and a test that does end the process (here: a NULL read through ctypes, an
    os._exit) fails its exercise with the line it was running, while a new process grades the others."""
    root = _copy_repo(tmp_path)
    _write_function(root, 3, "slot_mapping_for", (
        "\ndef slot_mapping_for(block_table, start, end, block_size):\n"
        "    import ctypes\n"
        "    return ctypes.string_at(0)  # reads address 0: SIGSEGV"))
    _solve(root, 3, "compute_block_hash")
    _solve(root, 3, "match_prefix")
    _write_function(root, 3, "paged_decode_torch", (
        "\ndef paged_decode_torch(q, k_cache, v_cache, block_tables, context_lens, scale):\n"
        "    import os\n"
        "    os._exit(3)  # ends Python with no exception"))
    kernel = _function_source(os.path.join(root, "solutions", "ch3.py"), "paged_decode_kernel")
    unmasked = kernel.replace("o.to(out_ptr.dtype.element_ty), mask=mask_o)", "o.to(out_ptr.dtype.element_ty))")
    assert unmasked != kernel  # the output store without its mask: rows past GROUP fall past `out`
    _write_function(root, 3, "paged_decode_kernel", unmasked)
    lines = open(os.path.join(root, "exercises", "ch3.py")).read().splitlines()
    null_line = next(i for i, line in enumerate(lines, 1) if "ctypes.string_at(0)" in line)
    r = run_in(root, "-m", "minillm.course.grade")
    assert r.returncode == 1, r.stdout + r.stderr
    assert re.search(r"\n3\.1 +slot_mapping_for +failed +0/1", r.stdout), r.stdout
    assert "the grading process died (SIGSEGV) while this test ran" in r.stdout, r.stdout
    assert f"still running exercises/ch3.py:{null_line} in slot_mapping_for: return ctypes.string_at(0)" in r.stdout
    assert re.search(r"\n3\.2 +compute_block_hash, match_prefix +passed", r.stdout), r.stdout
    assert re.search(r"\n3\.3 +paged_decode_torch +failed +0/1", r.stdout), r.stdout
    assert "the grading process exited (status 3) while this test ran" in r.stdout, r.stdout
    assert "in paged_decode_torch: os._exit(3)" in r.stdout, r.stdout
    assert re.search(r"\n3\.5 +paged_decode_kernel +failed", r.stdout), r.stdout
    assert "KernelOutOfBounds: tl.store outside every tensor the kernel was given" in r.stdout, r.stdout
    assert "past the end of out_ptr's storage" in r.stdout, r.stdout
    assert "in paged_decode_kernel: tl.store(out_ptr" in r.stdout, r.stdout
    assert "Fatal Python error" not in r.stdout + r.stderr, r.stdout + r.stderr


def test_a_syntax_error_is_one_message_naming_the_file_and_line(tmp_path):
    """It fails that chapter's exercises with the file's line; the other chapters still grade."""
    root = _copy_repo(tmp_path)
    _write_function(root, 3, "slot_mapping_for", (
        "\ndef slot_mapping_for(block_table, start, end, block_size):\n"
        "    return [block_table[p // block_size] * block_size + p % block_size for p in range(start, end)"))
    _solve(root, 2, "rms_norm")
    r = run_in(root, "-m", "minillm.course.grade")
    assert r.returncode == 1, r.stdout + r.stderr
    assert re.search(r"\n2\.1 +rms_norm +passed +(\d+)/\1\b", r.stdout), r.stdout
    assert re.search(r"\n3\.1 +slot_mapping_for +failed", r.stdout), r.stdout
    assert "exercises/ch3.py, line " in r.stdout and "was never closed (a syntax error" in r.stdout, r.stdout
    assert "Traceback" not in r.stdout + r.stderr, r.stdout + r.stderr


def _solve(root: str, chapter: int, name: str) -> None:
    """Exercise function `name` of root's exercises/chN.py replaced by its solution."""
    _write_function(root, chapter, name, _function_source(os.path.join(root, "solutions", f"ch{chapter}.py"), name))


def test_a_chapter_file_that_does_not_import_fails_only_its_own_exercises(tmp_path):
    """A typo in an import of exercises/ch2.py used to fail every chapter's graded tests (every
    chapter file was imported up front), and chapter 3's failures named ch2's line."""
    root = _copy_repo(tmp_path)
    _solve(root, 3, "slot_mapping_for")
    _solve(root, 2, "rms_norm")
    ch2 = os.path.join(root, "exercises", "ch2.py")
    text = open(ch2).read()
    with open(ch2, "w") as f:
        f.write(text.replace("\nimport math\n", "\nimport math\nimport numpyy\n", 1))
    r = run_in(root, "-m", "minillm.course.grade", "--exercise", "3.1")
    assert r.returncode == 0 and re.search(r"\n3\.1 +slot_mapping_for +passed +5/5", r.stdout), r.stdout + r.stderr
    r = run_in(root, "-m", "minillm.course.grade", "--exercise", "2.1")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "exercises/ch2.py does not import, so rms_norm cannot run: ModuleNotFoundError" in r.stdout, r.stdout
    assert "raised at exercises/ch2.py:" in r.stdout and "import numpyy" in r.stdout, r.stdout


def test_the_notebook_switch_rerun_after_an_edit_runs_the_edited_code(tmp_path):
    """The student's loop: switch on, write the function, run the switch cell again. The second run
    used to keep the module imported the first time (the stub, or the buggy version)."""
    root = _copy_repo(tmp_path)
    _solve(root, 2, "rope_cos_sin")  # 2.3 half written: apply_rotary is still the stub
    script = f"""
import os, torch
from minillm.course.exercises import use_my_code
import minillm.layers.layernorm as norms
use_my_code(2, True)
print("before the edit:", norms.rms_norm(torch.zeros(1, 4), torch.ones(4), 1e-6).tolist())  # the stub: minillm's
path = os.path.join({root!r}, "exercises", "ch2.py")
text = open(path).read()
start = text.index("\\ndef rms_norm(")
end = text.index("\\n\\n\\n", start)
open(path, "w").write(text[:start] + "\\ndef rms_norm(x, weight, eps):\\n    return x * 0 + 7" + text[end:])
use_my_code(2, True)
print("edited version:", norms.rms_norm(torch.ones(1, 4), torch.ones(4), 1e-6).tolist())
"""
    r = run_in(root, "-c", script)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "before the edit: [[0.0, 0.0, 0.0, 0.0]]" in r.stdout, r.stdout
    assert "edited version: [[7.0, 7.0, 7.0, 7.0]]" in r.stdout, r.stdout
    # a partly written exercise: the switch names what runs the student's code and what does not
    assert "2.3 rope_cos_sin (apply_rotary not written yet: minillm's runs)" in r.stdout, r.stdout


def test_a_negative_timeout_is_a_one_line_error(capsys):
    from minillm.course.grade import main
    with pytest.raises(SystemExit) as exit_:
        main(["--timeout", "-1"])
    assert exit_.value.code == 2 and "error: --timeout must be >= 0 seconds" in capsys.readouterr().err


def test_the_notebook_switch_says_which_code_runs_and_how_to_check_it(repo_copy):
    """The switch's message; then a notebook check that fails says it ran the student's code for the
    exercises it names (and is silent when it passed, or when none of them is the student's); and
    swap.reference gives minillm's own function for the notebook to compare with."""
    script = """
from minillm.course.exercises import find_exercises, use_my_code
import importlib
mod = importlib.import_module(next(e.module for e in find_exercises() if e.id == "3.1"))
minillms = mod.slot_mapping_for
swap = use_my_code(3, True)
print("reference is minillm's:", swap.reference("slot_mapping_for") is minillms is not mod.slot_mapping_for)
print("--- passed"); swap.suspect(True, "3.1")
print("--- not yours"); swap.suspect(False, "3.2")
print("--- failed"); swap.suspect(False, "3.2", "3.1")
"""
    r = run_in(repo_copy, "-c", script)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "running your code (exercises/) for: 3.1 slot_mapping_for" in r.stdout, r.stdout
    assert "check yours first: make grade EX=3.1" in r.stdout, r.stdout
    assert "reference is minillm's: True" in r.stdout, r.stdout
    tail = r.stdout.split("--- passed\n", 1)[1]
    assert tail.startswith("--- not yours\n--- failed\n-> this check failed, and it ran your code for 3.1 "
                           "slot_mapping_for (USE_MY_CODE = True): make grade EX=3.1 names what is wrong"), r.stdout


def _exercise_tests() -> None:
    """tests/exercises importable (the graded tests and the catalogue of known wrong versions)."""
    path = os.path.join(REPO_DIR, "tests", "exercises")
    if path not in sys.path:
        sys.path.insert(0, path)


def _ch4_graded(replaced: dict, test: str, drop: str | None = None) -> str | None:
    """Chapter 4's graded `test` run on minillm with the functions in `replaced`, and with the known wrong
    version `drop` out of the catalogue -> its failure message (None if it passed)."""
    import types
    from unittest import mock
    _exercise_tests()
    import mistakes
    import test_ch4
    from minillm.course.exercises import load_impl
    kept = {k: m for k, m in mistakes.all_mistakes().items() if k != drop}
    impl = types.SimpleNamespace(**{**vars(load_impl("ref")), **replaced})
    with mock.patch.object(mistakes, "all_mistakes", lambda: kept):
        try:
            getattr(test_ch4, test)(impl=impl)
        except AssertionError as failure:
            return str(failure)
    return None


def test_the_thread_ranks_pass_an_async_collective_that_is_waited_on():
    """The thread ranks fail a handle of all_reduce(..., async_op=True) never waited on (a race between
    processes, which their synchronous group hides): one waited on is right and must pass."""
    import torch.distributed as dist
    import torch.nn.functional as F

    def waited(x, weight, bias, group):
        y = F.linear(x, weight)
        work = dist.all_reduce(y, group=group, async_op=True)
        work.wait()
        return y if bias is None else y + bias
    assert _ch4_graded({"row_parallel_linear": waited}, "test_row_parallel_linear_on_two_thread_ranks") is None


def test_a_known_bug_is_named_only_where_it_matches_on_every_rank():
    """A right gather whose other ranks return their own slice (not None) matched the "no gather" bug on rank 1
    alone, and was told to gather: with its own entry out of the catalogue, no known bug is named, and the
    message says why rank 1 returns None."""
    _exercise_tests()
    from mistakes import all_mistakes
    from mistakes_ch4 import lm_head_logits_on_every_rank, lm_head_without_gather
    message = _ch4_graded({"parallel_lm_head": lm_head_logits_on_every_rank},
                          "test_parallel_lm_head_on_two_thread_ranks", drop="ch4_lm_head_logits_on_every_rank")
    assert message is not None and "looks like a known bug" not in message, message
    assert not any(m.hint in message for m in all_mistakes().values()
                   if lm_head_without_gather in m.replaces.values()), message
    assert ("parallel_lm_head must return None on rank 1 of 2: rank 0 of the group alone holds the full logits "
            "(it samples); every other rank returns None, as vLLM's LM head does (it returned a tensor of shape "
            "(3, 256))") in message, message


def test_the_scoreboard_stops_before_a_property_tests_failing_example():
    """hypothesis appends the failing example after a property test's message; cut at MESSAGE_LINES it was a
    dangling 'Failing test case: property_holds(' line. The scoreboard stops before it and says where the rest is."""
    from minillm.course.grade import Result, scoreboard
    message = "test_x: Exercise 6.4 (tpots): tpots(...) has shape (0,), expected (1,)\n  -- see the notebook\n" \
              "Failing test case: property_holds(\n    case=[...],\n)"
    board = scoreboard([Result("6.4", "tpots", "failed", 0, 1, message)], "exercises")
    assert "has shape (0,), expected (1,)" in board and "-- see the notebook" in board
    assert "Failing test case" not in board
    assert "make grade EX=6.4 VERBOSE=1" in board


def test_a_class_assignment_grades_the_chapters_or_exercises_it_names(tmp_path):
    """make grade EX=2,3 (or 2.1,3.4): those exercises alone, in the scoreboard and in Gradescope's
    results.json (its max_score their count); a name that is neither an exercise nor a chapter is an error."""
    from minillm.course.grade import main, select
    ids = [e.id for e in select("2.1,3")]
    assert ids == ["2.1"] + [e.id for e in find_exercises() if e.chapter == 3]
    assert [e.id for e in select("2")] == [e.id for e in find_exercises() if e.chapter == 2]
    assert select(None) == find_exercises()
    with pytest.raises(ValueError, match="no exercise or chapter '9'"):
        select("2,9")
    results = grade("exercises", "2.1,3")  # the untouched stubs: every one not started, none run
    assert [r.id for r in results] == ids and {r.status for r in results} == {"not started"}
    out = tmp_path / "results.json"
    with pytest.raises(SystemExit):
        main(["--exercise", "2.1,3", "--json", str(out)])
    report = json.loads(out.read_text())
    assert report["max_score"] == len(ids) and [t["number"] for t in report["tests"]] == ids


def test_a_crash_in_an_old_triton_interpreter_is_the_machines_not_the_students(monkeypatch):
    """The GPU image's triton 3.6 interpreter cannot run a loop over a runtime bound (3.7 can): a crash
    raised inside it with that error is told as the machine's, and only on a triton before 3.7."""
    import triton
    from minillm.course import grade as grade_mod
    code = compile(f"raise TypeError({grade_mod.OLD_INTERPRETER_ERROR!r})",
                   os.path.join("site-packages", "triton", "runtime", "interpreter.py"), "exec")
    try:
        exec(code, {})
    except TypeError as e:
        crash = e
    monkeypatch.setattr(triton, "__version__", "3.6.0")
    assert "triton 3.6.0 interpreter cannot run a loop over a runtime bound" in grade_mod.machine_limit(crash)
    assert grade_mod.machine_limit(TypeError(grade_mod.OLD_INTERPRETER_ERROR)) is None  # not raised in triton
    monkeypatch.setattr(triton, "__version__", "3.7.1")
    assert grade_mod.machine_limit(crash) is None


def test_a_partly_written_exercise_shows_the_bug_in_what_is_written_first(tmp_path):
    """5.1 with only graph_size_for written, wrongly: the first failure shown is its bug, not 'implement
    graph_batch_sizes' (the stub's test ran first; a failure of written code says more)."""
    root = _copy_repo(tmp_path)
    right = _function_source(os.path.join(root, "solutions", "ch5.py"), "graph_size_for")
    wrong = right.replace("return next((s for s in sizes if s >= batch_size), None)",
                          "return max((s for s in sizes if s <= batch_size), default=None)")
    assert wrong != right
    _write_function(root, 5, "graph_size_for", wrong)
    r = run_in(root, "-m", "minillm.course.grade", "--exercise", "5.1")
    first = r.stdout.split("first failure", 1)[1]
    assert "looks like a known bug: the batch gets the largest captured size <= B" in first, r.stdout + r.stderr
    assert "implement graph_batch_sizes" not in first.splitlines()[1], r.stdout


def test_the_gradescope_entry_point_grades_a_submission(tmp_path):
    """notebooks/lecturer/gradescope/run_autograder, with Gradescope's paths pointed at a repository copy:
    the submission's chN.py replaces that chapter's stub, EX picks the assignment, results.json scores it."""
    root = _copy_repo(tmp_path / "repo")
    submission = tmp_path / "submission" / "exercises"
    submission.mkdir(parents=True)
    stub = open(os.path.join(root, "exercises", "ch3.py")).read()
    solved = stub.replace(_function_source(os.path.join(root, "exercises", "ch3.py"), "slot_mapping_for"),
                          _function_source(os.path.join(root, "solutions", "ch3.py"), "slot_mapping_for"))
    (submission / "ch3.py").write_text(solved)
    results = tmp_path / "results" / "results.json"
    env = {**os.environ, **ONE_THREAD, "MINILLM_REPO": root, "AUTOGRADER_SUBMISSION": str(tmp_path / "submission"),
           "AUTOGRADER_RESULTS": str(results), "PY": sys.executable, "EX": "3.1,3.2",
           "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    env.pop("MINILLM_IMPL", None)
    p = subprocess.run(["bash", os.path.join(REPO_DIR, "notebooks", "lecturer", "gradescope", "run_autograder")],
                       env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0 and "1 exercise file(s)" in p.stdout, p.stdout + p.stderr
    report = json.loads(results.read_text())
    assert [(t["number"], t["score"]) for t in report["tests"]] == [("3.1", 1.0), ("3.2", 0.0)], report
    assert report["max_score"] == 2.0
    # the next student's submission, graded in the same checkout (a lecturer's loop over a class): none of the
    # previous student's ch3.py may count for them
    (submission / "ch3.py").unlink()
    (submission / "ch2.py").write_text(open(os.path.join(root, "exercises", "ch2.py")).read())
    p = subprocess.run(["bash", os.path.join(REPO_DIR, "notebooks", "lecturer", "gradescope", "run_autograder")],
                       env=env, capture_output=True, text=True, timeout=600)
    assert "1 exercise file(s)" in p.stdout, p.stdout + p.stderr
    report = json.loads(results.read_text())
    assert [(t["number"], t["score"]) for t in report["tests"]] == [("3.1", 0.0), ("3.2", 0.0)], report
