"""The lecturer's kit (notebooks/lecturer/): its generated sections are current, every chapter file has
its four parts, the lecture plans fill 90 minutes, and the worked answers give what the checker accepts."""
from __future__ import annotations

import os
import re
import shutil

import pytest

from minillm.course import kit
from minillm.course import questions as Q

CHAPTERS = ["00_tour", "01_vocab_weights_runtime", "02_decoder_layer", "03_paged_kv_cache", "04_tensor_parallel",
            "05_engine_performance", "06_serving"]
PARTS = ["## Learning objectives", "## A 90-minute lecture", "## Check your understanding: the answer key",
         "## Common mistakes the grader diagnoses"]


def read(name: str) -> str:
    return open(os.path.join(kit.KIT_DIR, name), encoding="utf-8").read()


def test_generated_sections_are_current():
    stale = [os.path.basename(p) for p in kit.stale()]
    assert not stale, f"the kit's generated sections are stale in {stale}: run `{kit.COMMAND}`"


def test_check_fails_on_a_stale_section(tmp_path, monkeypatch, capsys):
    shutil.copy(os.path.join(kit.KIT_DIR, "03_paged_kv_cache.md"), tmp_path)
    path = tmp_path / "03_paged_kv_cache.md"
    path.write_text(path.read_text().replace("`ch3_", "`ch3_renamed_", 1))
    monkeypatch.setattr(kit, "KIT_DIR", str(tmp_path))
    with pytest.raises(SystemExit) as e:
        kit.main(["--check"])
    assert e.value.code == 1 and "03_paged_kv_cache.md" in capsys.readouterr().out
    kit.main([])
    kit.main(["--check"])  # rewritten: current again


def test_a_section_without_its_end_marker_is_an_error(tmp_path):
    path = tmp_path / "03_x.md"
    path.write_text(f"# x\n{kit.SECTIONS['mistakes'][0]}\nno end\n")
    with pytest.raises(ValueError, match="end of common mistakes"):
        kit.render(str(path))


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_every_chapter_file_has_its_four_parts_in_order(chapter):
    text = read(chapter + ".md")
    where = [text.find(p) for p in PARTS]
    assert -1 not in where and where == sorted(where), f"{chapter}.md needs the sections {PARTS}, in that order"
    for name in ("answers", "mistakes"):
        assert kit.SECTIONS[name][0] in text, f"{chapter}.md lacks the generated {name} section's markers"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_the_lecture_plan_fills_90_minutes(chapter):
    plan = read(chapter + ".md").split("## A 90-minute lecture", 1)[1].split("\n## ", 1)[0]
    spans = [(int(a), int(b)) for a, b in re.findall(r"^\| (\d+)–(\d+) \|", plan, re.M)]
    assert spans and spans[0][0] == 0 and spans[-1][1] == 90, spans
    assert all(b0 == a1 for (_, b0), (a1, _) in zip(spans, spans[1:])), f"gaps or overlaps: {spans}"


def parse_answer(text: str):
    """An answer as the worked answers write it in their heading: 23,040 | 55.3 | 3.66 ms | (6, 5) |
    [2, 4, 8] | (b) (units after a number are dropped)."""
    text = text.strip()
    if re.fullmatch(r"\([a-z]\)", text):
        return text[1]
    if text.startswith("(") and ", " in text:
        return tuple(parse_answer(p) for p in text[1:-1].split(", "))
    if text.startswith("["):
        return [parse_answer(p) for p in text[1:-1].split(", ")]
    return float(re.match(r"-?[\d,]*\.?\d+", text).group().replace(",", ""))


def heading_answer(heading: str) -> str:
    """The text inside the last balanced parentheses of a heading: '... ((6, 5))' -> '(6, 5)'."""
    assert heading.endswith(")"), heading
    depth = 0
    for i in range(len(heading) - 1, -1, -1):
        depth += {")": 1, "(": -1}.get(heading[i], 0)
        if depth == 0:
            return heading[i + 1:-1]
    raise AssertionError(f"unbalanced parentheses in {heading!r}")


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_every_question_has_a_worked_answer_that_the_checker_accepts(chapter):
    key = read(chapter + ".md").split("## Check your understanding: the answer key", 1)[1]
    for q in Q.questions(chapter):
        n = q.id[1:]
        m = re.search(rf"^\*\*Q{n} — (.+?)\.\*\*", key, re.M)
        assert m, f"{chapter}.md: no worked answer headed '**Q{n} — ... (answer).**'"
        answer = heading_answer(m.group(1))
        status = q.check(parse_answer(answer))
        assert status == Q.CORRECT, f"{chapter}.md Q{n}: the key's answer {answer} -> {status}"


def test_the_index_links_every_chapter_file_and_says_how_to_run_and_grade():
    text = read("README.md")
    for name in CHAPTERS + ["02a_triton_primer", "05_engine_performance"]:
        assert f"]({name}.md)" in text, name
    for must in ("make setup", "make lab", "pip install -q -e", "make slides", "make grade",
                 "python -m minillm.course.grade --json results.json", kit.SECTIONS["notebooks"][0]):
        assert must in text, must
