import json
import os

import pytest

from helpers import COUNTS, DATA, needs_data
from tarpo.tasks.chat_messages import answer_tag, system_prompts
from tarpo.tasks.record_parsers import DataError
from tarpo.tasks.registry import TASKS, load_task
from tarpo.tasks.synthetic import canonical_form, worked_examples


@needs_data
@pytest.mark.parametrize("task,rel,split,n", COUNTS)
def test_every_shared_file_loads_with_its_row_count(task, rel, split, n):
    ds = load_task(task, os.path.join(DATA, rel), split)
    assert len(ds) == n
    kind = TASKS[task].kind
    for ex in ds.select(range(0, n, max(1, n // 25))):
        assert ex["prompt"][0] == {"role": "system", "content": system_prompts()[kind]["system"]}
        assert ex["prompt"][1]["role"] == "user" and ex["prompt"][1]["content"].strip()
        assert ex["gold"].strip() and ex["task"] == task and ex["id"]


@needs_data
def test_normalised_fields_of_each_format():
    gsm = load_task("gsm8k", os.path.join(DATA, "gsm8k"), "test")[0]
    assert gsm["gold"] == "18" and gsm["prompt"][1]["content"].startswith("Janet")
    math = load_task("math", os.path.join(DATA, "math"), "test")[0]
    assert (math["gold"], math["level"], math["subject"], math["id"]) == ("2", "Level 3", "Algebra",
                                                                          "test/algebra/1.json")
    m500 = load_task("math500", os.path.join(DATA, "math500"), "test")[0]
    assert m500["gold"] == "\\left( 3, \\frac{\\pi}{2} \\right)" and m500["level"] == "2"
    amc = load_task("amc23", os.path.join(DATA, "amc23"), "test")[0]
    assert amc["gold"] == "27"  # 27.0 in the file
    oly = load_task("olympiadbench", os.path.join(DATA, "olympiadbench"), "test")
    assert oly[0]["gold"] == "2" and oly[0]["subject"] == "Combinatorics"
    arc = load_task("arc_challenge", os.path.join(DATA, "arc_challenge"), "test")
    first = arc[0]
    assert first["gold"] == "C" and "\nA. Planetary density will decrease." in first["prompt"][1]["content"]
    numeric = [ex for ex in arc if "\n1. " in ex["prompt"][1]["content"]]
    assert not numeric, "numeric labels are shown as letters"
    he = load_task("humaneval", os.path.join(DATA, "humaneval"), "test")[0]
    assert he["entry_point"] == "has_close_elements" and "def check" in he["test"]
    assert he["prompt"][0]["content"] == system_prompts()["code"]["system"]


def test_prompts_are_the_papers_text():
    p = system_prompts()
    assert p["math"]["system"].endswith("The final answer is provided after the #### tag, i.e., "
                                        "{reasoning process} #### {answer}.")
    assert "The user asks a multiple-choice question" in p["multiple_choice"]["system"]
    assert p["multiple_choice"]["system"].endswith("MUST be exactly one of the option letters (A, B, C, or D). "
                                                   "i.e., {reasoning process} #### {option letter}.")
    assert p["code"]["system"].endswith("enclosed EXACTLY within ```python and ``` tags.")
    assert answer_tag("math") == "####" and answer_tag("code") == "```python"


def write_jsonl(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return str(path)


def test_malformed_rows_name_file_row_and_field(tmp_path):
    path = write_jsonl(tmp_path / "g.jsonl", [{"question": "q", "answer": "x #### 3"}, {"question": "q2"}])
    with pytest.raises(DataError, match=r"g\.jsonl: row 2: missing field 'answer'"):
        load_task("gsm8k", path)
    path = write_jsonl(tmp_path / "bad.jsonl", [{"question": "q", "answer": "x #### 3"}, "{not json"])
    with pytest.raises(DataError, match=r"bad\.jsonl: row 2: not valid JSON"):
        load_task("gsm8k", path)
    path = write_jsonl(tmp_path / "m.jsonl", [{"problem": "p", "solution": "no box here"}])
    with pytest.raises(DataError, match=r"row 1: field 'solution' has no \\boxed"):
        load_task("math", path)
    path = write_jsonl(tmp_path / "o.jsonl", [{"question": "q", "final_answer": "['1'"}])
    with pytest.raises(DataError, match="final_answer"):
        load_task("olympiadbench", path)
    with pytest.raises(DataError, match="no records"):
        load_task("gsm8k", write_jsonl(tmp_path / "empty.jsonl", []))
    with pytest.raises(ValueError, match="unknown task"):
        load_task("nope", path)


def test_math_folder_layout_and_small_gpqa_and_dapo_files(tmp_path):
    for subject, n in [("algebra", 2), ("geometry", 1)]:
        os.makedirs(tmp_path / "MATH" / "test" / subject)
        for i in range(n):
            (tmp_path / "MATH" / "test" / subject / f"{i}.json").write_text(json.dumps(
                {"problem": f"p{i}", "level": "Level 2", "type": subject.title(),
                 "solution": f"so \\boxed{{\\frac{{{i}}}{{2}}}}"}))
    ds = load_task("math", str(tmp_path / "MATH"), "test")
    assert [e["id"] for e in ds] == ["test/algebra/0.json", "test/algebra/1.json", "test/geometry/0.json"]
    assert ds[1]["gold"] == "\\frac{1}{2}"

    gpqa = write_jsonl(tmp_path / "gpqa.jsonl", [
        {"Record ID": "rec1", "Question": "Which?", "Correct Answer": "right",
         "Incorrect Answer 1": "w1", "Incorrect Answer 2": "w2", "Incorrect Answer 3": "w3"}])
    ex = load_task("gpqa_diamond", gpqa)[0]
    shown = ex["prompt"][1]["content"]
    assert f"{ex['gold']}. right" in shown and shown.count("\n") == 5
    assert load_task("gpqa_diamond", gpqa)[0]["gold"] == ex["gold"]  # the shuffle is fixed per question

    dapo = write_jsonl(tmp_path / "dapo.jsonl", [{"prompt": "Find x.", "solution": "34"}])
    assert load_task("dapo", dapo)[0]["gold"] == "34"


@pytest.mark.parametrize("task", ["arith_one", "arith_two"])
def test_no_commuted_twin_across_the_arithmetic_split(task):
    """A held-out ``b + a`` whose twin ``a + b`` is a training question has the same answer: the model has seen it.
    The split deals each problem by its canonical form, so the twins fall on one side. Read through the loader, as
    training and evaluation read it."""
    def questions(split):
        return [r["prompt"][-1]["content"] for r in load_task(task, split=split)]
    train, test = ({canonical_form(q) for q in questions(s)} for s in ("train", "test"))
    assert test and train and not train & test
    assert not test & {canonical_form(q) for q in worked_examples(task)}  # nor a question the prompt answers
    reordered = [q for q in questions("test") if canonical_form(q) != canonical_form(q.replace(" + ", " - "))]
    assert reordered  # the test split holds additions, whose twins the check above looked for
