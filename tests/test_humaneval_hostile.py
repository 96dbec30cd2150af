"""Wrong HumanEval solutions that attack the grader itself must score 0 (docs/humaneval-sandbox.md).

Every program below is a *wrong* solution (it returns a constant, or nothing at all) that
tries to make the grader count a pass anyway: by ending its process with status 0 before or
while the tests run, by faking equality, by rebinding a builtin the tests use, by hooking
``check``, or by reading the canonical solution from the benchmark file. Each is graded
through the evaluation path (``grade_batch``) and through the training reward
(``reward_function("humaneval")``), once with the static screen and once without it (so that
the structural layers alone are shown to hold). See docs/humaneval-sandbox.md.
"""

import os
import sys
import textwrap
import time

import pytest

from helpers import DATA, needs
from tarpo.tasks import sandbox
from tarpo.tasks.graders import grade_batch, reward_function
from tarpo.tasks.registry import load_task

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox targets Linux")

needs_data = needs("humaneval")


def _wrong(name, args, value="False"):
    return f"def {name}({args}):\n    return {value}\n"


def _exit_when_check_is_called(install):
    """A wrong answer that installs a Python hook (``sys.setprofile`` / ``sys.settrace``) exiting 0 as
    soon as the harness's ``check`` is called."""
    return textwrap.dedent(f"""\
        import os, sys
        def _hook(frame, event, arg):
            if event == "call" and frame.f_code.co_name == "check":
                os._exit(0)
        sys.{install}(_hook)
        """) + _wrong("has_close_elements", "numbers, threshold")


# (task index, completion code): every one is wrong, and every one scored 1.0 before the fix.
HOSTILE = {
    "os_exit": (0, "import os\n" + _wrong("has_close_elements", "numbers, threshold") + "os._exit(0)\n"),
    "raise_system_exit": (0, _wrong("has_close_elements", "numbers, threshold") + "raise SystemExit(0)\n"),
    "sys_exit_in_function": (0, textwrap.dedent("""\
        import sys
        def has_close_elements(numbers, threshold):
            sys.exit(0)
        """)),
    "atexit_handler": (0, textwrap.dedent("""\
        import atexit, os
        atexit.register(lambda: os._exit(0))
        def has_close_elements(numbers, threshold):
            return False
        """)),
    "excepthook": (0, textwrap.dedent("""\
        import os, sys
        sys.excepthook = lambda *exc: os._exit(0)
        def has_close_elements(numbers, threshold):
            return False
        """)),
    "sigalrm_handler": (0, textwrap.dedent("""\
        import os, signal, time
        signal.signal(signal.SIGALRM, lambda *a: os._exit(0))
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        def has_close_elements(numbers, threshold):
            time.sleep(2)
            return False
        """)),
    "thread_os_exit": (0, textwrap.dedent("""\
        import os, threading, time
        def has_close_elements(numbers, threshold):
            threading.Thread(target=lambda: os._exit(0)).start()
            time.sleep(2)
            return False
        """)),
    "always_equal": (0, textwrap.dedent("""\
        class Anything:
            def __eq__(self, other):
                return True
            __hash__ = object.__hash__
        def has_close_elements(numbers, threshold):
            return Anything()
        """)),
    "always_equal_int_subclass": (0, textwrap.dedent("""\
        class Anything(int):
            def __eq__(self, other):
                return True
            __hash__ = int.__hash__
        def has_close_elements(numbers, threshold):
            return Anything(0)
        """)),
    "shadow_builtin": (2, "abs = lambda x: 0\n" + _wrong("truncate_number", "number", "0.5")),
    "rebind_builtins_module": (2, "import builtins\nbuiltins.abs = lambda x: 0\n"
                               + _wrong("truncate_number", "number", "0.5")),
    "setprofile_on_check": (0, _exit_when_check_is_called("setprofile")),
    "settrace_on_check": (0, _exit_when_check_is_called("settrace")),
    "read_benchmark_file": (0, textwrap.dedent("""\
        import json, os
        def _canonical(task_id, roots):
            for root in roots:
                for folder, dirs, files in os.walk(root):
                    dirs[:] = [d for d in dirs if d not in (".git", ".venv", ".mirror", ".library", "proc", "sys")]
                    for name in files:
                        if name.endswith(".jsonl"):
                            try:
                                with open(os.path.join(folder, name)) as f:
                                    for line in f:
                                        row = json.loads(line)
                                        if row.get("task_id") == task_id:
                                            return row["prompt"] + row["canonical_solution"]
                            except (OSError, ValueError):
                                pass
            raise FileNotFoundError(task_id)
        exec(_canonical("HumanEval/0", [DATA_HINT, "/work", "/home", "/root", "/srv", "/mnt", "/opt", "/data"]))
        """)),
    "print_fake_pass": (0, textwrap.dedent("""\
        import os, sys
        def has_close_elements(numbers, threshold):
            print("passed", flush=True)
            os.write(1, b"0" * 64 + b"\\n")
            os._exit(0)
        """)),
    "kill_the_tests": (0, textwrap.dedent("""\
        import os, signal
        def has_close_elements(numbers, threshold):
            for pid in range(1, 64):
                if pid != os.getpid():
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
            return False
        """)),
}
# The eleven kinds named in the issue; the others are variants of them.
ISSUE_CLASSES = ["os_exit", "raise_system_exit", "sys_exit_in_function", "atexit_handler", "excepthook",
                 "sigalrm_handler", "thread_os_exit", "always_equal", "shadow_builtin", "setprofile_on_check",
                 "read_benchmark_file"]


@pytest.fixture(scope="module")
def humaneval():
    return list(load_task("humaneval", os.path.join(DATA, "humaneval"), "test"))


def completions(humaneval):
    names = list(HOSTILE)
    texts, examples = [], []
    for name in names:
        index, code = HOSTILE[name]
        code = code.replace("DATA_HINT", repr(os.path.join(DATA, "humaneval")))
        texts.append(f"I will solve it.\n```python\n{code}```\n")
        examples.append(humaneval[index])
    return names, texts, examples


def grade_all(humaneval):
    names, texts, examples = completions(humaneval)
    start = time.monotonic()
    evaluation = [g.score for g in grade_batch(texts, examples, workers=len(texts), timeout=10)]
    columns = {k: [e[k] for e in examples] for k in ("gold", "task", "entry_point", "test", "code_prompt")}
    training = reward_function("humaneval", workers=len(texts), timeout=10)([e["prompt"] for e in examples],
                                                                           texts, **columns)
    print(f"{len(texts)} hostile programs, graded twice, in {time.monotonic() - start:.1f}s")
    return {n: (e, t) for n, e, t in zip(names, evaluation, training)}


@pytest.fixture(scope="module")
def screened(humaneval):
    return grade_all(humaneval)


@pytest.fixture(scope="module")
def unscreened(humaneval):
    """The same battery with the static screen switched off: the structural layers alone."""
    mp = pytest.MonkeyPatch()
    mp.setattr(sandbox, "screen", lambda code: None)
    try:
        return grade_all(humaneval)
    finally:
        mp.undo()


@needs_data
def test_battery_covers_every_class_of_the_issue():
    assert set(ISSUE_CLASSES) <= set(HOSTILE) and len(ISSUE_CLASSES) == 11


@needs_data
@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_completion_scores_zero(name, screened, unscreened):
    assert screened[name] == (0.0, 0.0), f"{name}: (evaluation, reward) = {screened[name]} with the screen"
    assert unscreened[name] == (0.0, 0.0), f"{name}: (evaluation, reward) = {unscreened[name]} without the screen"


@needs_data
def test_honest_solutions_still_pass_beside_the_battery(humaneval):
    """The same tasks, solved honestly (the body alone and the whole function), score 1.0."""
    examples = [humaneval[0], humaneval[2], humaneval[0], humaneval[2]]
    texts = [f"```python\n{examples[0]['gold']}```", f"```python\n{examples[1]['gold']}```",
             f"```python\n{examples[2]['code_prompt']}{examples[2]['gold']}```",
             "```python\ndef truncate_number(number):\n    return number % 1.0\n```"]
    assert [g.score for g in grade_batch(texts, examples, workers=4)] == [1.0] * 4
    columns = {k: [e[k] for e in examples] for k in ("gold", "task", "entry_point", "test", "code_prompt")}
    assert reward_function("humaneval", workers=4)([e["prompt"] for e in examples], texts, **columns) == [1.0] * 4


def unscreened_run(monkeypatch, prompt, code, test, entry_point):
    monkeypatch.setattr(sandbox, "screen", lambda code: None)
    return sandbox.run_humaneval(prompt, code, test, entry_point)


def level_available(level):
    if level == "namespaces+nobody" or sandbox.isolation() == "rlimits":
        return sandbox.isolation() == level
    probe = sandbox._run(level, "pass", timeout=10, memory_mb=512, max_processes=16, max_file_mb=1, cpu_seconds=None)
    return probe.passed


@pytest.mark.parametrize("level", ["namespaces+nobody", "userns"])
def test_the_completion_cannot_reach_the_tests_process(monkeypatch, level):
    """The nonce lives only in the tests' process: its script is gone and its memory, file
    descriptors and environment are closed to the completion's process (same uid; under
    userns both are root of the namespace, without capabilities)."""
    if not level_available(level):
        pytest.skip(f"no {level} isolation here")
    monkeypatch.setattr(sandbox, "isolation", lambda: level)
    code = textwrap.dedent("""\
        import os
        def f(x):
            found = {"main.py": os.path.exists("main.py")}
            for what in ["mem", "environ", "fd/1", "fd/0", "maps", "root/tmp"]:
                try:
                    with open(f"/proc/{os.getppid()}/{what}", "rb") as handle:
                        handle.read(16)
                    found[what] = "read"
                except OSError as exc:
                    found[what] = type(exc).__name__
            raise RuntimeError(repr(found))
        """)
    result = unscreened_run(monkeypatch, "", code, "def check(candidate):\n    candidate(1)\n", "f")
    assert result.status == "failed"
    found = eval(result.stderr.split("CandidateError: RuntimeError: ")[1].strip().splitlines()[0])
    assert found == {"main.py": False, "mem": "PermissionError", "environ": "PermissionError",
                     "fd/1": "PermissionError", "fd/0": "PermissionError", "maps": "PermissionError",
                     "root/tmp": "PermissionError"}, found


def test_values_cross_as_exact_plain_data(monkeypatch):
    code = textwrap.dedent("""\
        def f(items, table, raw, big):
            items[0] = "changed here only"
            return (None, True, 0, big, -0.0, float("inf"), 1.5, 2j, "s\\u00e9", raw, (1, [2]), [items],
                    {3}, frozenset({4}), {"k": table, 5: None, (6,): b""})
        """)
    test = textwrap.dedent("""\
        import math
        def check(candidate):
            items, table = [1, [2, 3]], {"a": (1, 2)}
            v = candidate(items, table, b"x\\x00", 2**300)
            assert items == [1, [2, 3]]
            assert v == (None, True, 0, 2**300, 0.0, math.inf, 1.5, 2j, "s\\u00e9", b"x\\x00", (1, [2]),
                         [["changed here only", [2, 3]]], {3}, frozenset({4}),
                         {"k": {"a": (1, 2)}, 5: None, (6,): b""})
            assert [type(x) for x in v] == [type(None), bool, int, int, float, float, float, complex, str, bytes,
                                            tuple, list, set, frozenset, dict]
            assert math.copysign(1.0, v[4]) == -1.0
        """)
    result = unscreened_run(monkeypatch, "", code, test, "f")
    assert result.passed, result.stderr
    for returned in ["(x for x in [1])", "print", "type('S', (str,), {})('a')", "bytearray(b'a')"]:
        result = unscreened_run(monkeypatch, "", f"def f():\n    return {returned}\n",
                                "def check(candidate):\n    candidate()\n", "f")
        assert result.status == "failed" and "not plain data" in result.stderr, (returned, result.stderr)
