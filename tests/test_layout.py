"""The package's shape: no import cycle (in the package, nor among the benchmarks), no import from a lower layer to
a higher one, no module over 340 lines, no function body over 60 lines anywhere in the package, docs/layout.md's
table is the tree, each routing rule and inference mode is one table entry that the launchers, the config and the
CLI read."""

import ast
import fnmatch
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "tarpo")
MAX_LINES = 340  # a module's lines: a module that grows past it is split by what its parts do
MAX_FUNCTION_LINES = 60  # a function's body, its docstring not counted, anywhere in the package
# The layers, lowest first: a module imports from its own layer or a lower one, never a higher one.
LAYERS = [
    {"tarpo.config", "tarpo.method_fields", "tarpo.engineering_fields",  # the settings (TarpoConfig's field groups),
     "tarpo.algorithms", "tarpo.atomic_files", "tarpo.losses",  # routing and loss tables, the presets' architectures,
     "tarpo.process_exit",  # a command's exit
     "tarpo.architectures", "tarpo.trl_fields"},  # TRL's inherited fields: no model code
    {"tarpo.engine", "tarpo.tasks"},                   # the rollout; data and grading
    {"tarpo.patches"},                                 # Unsloth's forward serving the engine
    {"tarpo.models"},                                  # loading a policy and its backend; tiny random models
    {"tarpo.training", "tarpo.evaluation"},            # the trainer; sampling and scoring trained systems
    {"tarpo.cli"},                                     # the tarpo command
    {"tarpo.runs"},                                    # the paper's runs (train, then `tarpo eval`); the CPU demo
]


def modules() -> dict[str, str]:
    """``tarpo.x.y`` -> file, for every module of the package (``tarpo.patches`` is ``patches/``)."""
    found = {}
    for base, prefix in ((PACKAGE, "tarpo"), (os.path.join(ROOT, "patches"), "tarpo.patches")):
        for folder, _, files in os.walk(base):
            for f in files:
                if f.endswith(".py"):
                    rel = os.path.relpath(os.path.join(folder, f), base)[:-3].replace(os.sep, ".")
                    name = prefix if rel == "__init__" else f"{prefix}.{rel.removesuffix('.__init__')}"
                    found[name] = os.path.join(folder, f)
    return found


def imports(name: str, path: str, known) -> set[str]:
    """The package modules ``path`` imports anywhere in it (top level or inside a function)."""
    package = name if path.endswith("__init__.py") else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            submodules = [f"{module}.{a.name}" for a in node.names if f"{module}.{a.name}" in known]
            # ``from . import sibling`` takes the sibling, not the package (whose __init__ may import it)
            targets = submodules if len(submodules) == len(node.names) else [module, *submodules]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            continue
        out |= {t for t in targets if t in known and t != name}
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_cycles_are_found():
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_package_has_no_import_cycle():
    known = modules()
    graph = {name: imports(name, path, known) for name, path in known.items()}
    # the scan sees imports
    assert graph["tarpo.engine.rollout"] >= {"tarpo.engine.step", "tarpo.engine.static_decode"}
    assert cycles(graph) == []


def test_the_benchmarks_have_no_import_cycle():
    """The scripts of benchmarks/ import each other by name (their folder on sys.path): no circle among them
    (before: gpu_session and bench_write_positions imported each other)."""
    folder = os.path.join(ROOT, "benchmarks")
    known = {f[:-3]: os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".py")}
    graph = {name: imports(name, path, known) for name, path in known.items()}
    assert graph["decode_drift"] >= {"bench_write_positions"}  # the scan sees imports
    assert cycles(graph) == []


def layer(module: str) -> int:
    top = ".".join(module.split(".")[:2])
    found = [i for i, names in enumerate(LAYERS) if top in names or module == "tarpo"]
    assert found, f"{module} is in no layer of LAYERS"
    return found[0]


def test_no_module_imports_from_a_higher_layer():
    known = modules()
    upward = sorted((name, target) for name, path in known.items() for target in imports(name, path, known)
                    if layer(target) > layer(name))
    assert upward == []


def test_an_upward_import_is_found():
    assert layer("tarpo.engine.step") < layer("tarpo.training.trainer")
    assert layer("tarpo.patches.trl_guard") < layer("tarpo.models.loading") < layer("tarpo.cli.eval")


def training_imports(name: str, source: str, is_package: bool = False) -> set[str]:
    """The ``tarpo.training`` modules that ``source`` (the module ``name``) imports anywhere in it, relative
    imports resolved: ``from .. import training`` in ``tarpo.cli.case`` is ``tarpo.training``."""
    package = name if is_package else name.rsplit(".", 1)[0]
    inside = lambda m: m == "tarpo.training" or m.startswith("tarpo.training.")  # noqa: E731
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            out |= {module} if inside(module) else {f"{module}.{a.name}" for a in node.names
                                                    if inside(f"{module}.{a.name}")}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if inside(a.name)}
    return out


def test_no_cli_module_imports_training():
    """The command parses flags and calls evaluation (or the runs); the trainer's rules reach it through
    evaluation, which shares training's layer, so the layer test alone would let cli -> training pass."""
    cli = {name: path for name, path in modules().items() if name == "tarpo.cli" or name.startswith("tarpo.cli.")}
    assert {"tarpo.cli", "tarpo.cli.eval", "tarpo.cli.case"} <= set(cli)
    found = {name: training_imports(name, open(path).read(), path.endswith("__init__.py"))
             for name, path in cli.items()}
    assert {name: sorted(targets) for name, targets in found.items() if targets} == {}


def test_a_cli_import_of_training_is_found():
    case = "tarpo.cli.case"
    assert training_imports(case, "from ..training.advantages import group_advantages\n") == {
        "tarpo.training.advantages"}
    assert training_imports(case, "from .. import evaluation, training\n") == {"tarpo.training"}
    assert training_imports(case, "import tarpo.training.distributed as d\n") == {"tarpo.training.distributed"}
    assert training_imports(case, "def run():\n    from tarpo.training import trainer\n") == {"tarpo.training"}
    assert training_imports("tarpo.cli", "from ..training import trainer\n", is_package=True) == {"tarpo.training"}
    assert training_imports("tarpo.cli", "from .training import x\n", is_package=True) == set()  # tarpo.cli.training
    assert training_imports(case, "from ..evaluation.case_study import case_study\n"
                                  "import tarpo.trainingset\n") == set()


def body_lines(node) -> int:
    body = node.body
    if (isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)):
        body = body[1:] or body
    return body[-1].end_lineno - body[0].lineno + 1


def test_no_function_in_the_package_is_over_60_lines():
    long = {}
    for path, source in package_sources().items():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and body_lines(node) > MAX_FUNCTION_LINES:
                long[f"{path}:{node.name}"] = body_lines(node)
    assert long == {}


def test_body_lines_leaves_out_the_docstring():
    node = ast.parse('def f():\n    """doc\n    string"""\n    a = 1\n    return a\n').body[0]
    assert body_lines(node) == 2


def test_no_module_is_over_340_lines():
    sizes = {os.path.relpath(path, ROOT): sum(1 for _ in open(path)) for path in modules().values()}
    assert {path: n for path, n in sizes.items() if n > MAX_LINES} == {}


# Names of tarpo/ and patches/ that code outside this tree calls, though only the tests name them: why each stays.
CALLED_FROM_OUTSIDE = {
    "tarpo/training/callbacks.py:*.on_*": "TrainerCallback events: transformers' CallbackHandler calls them by name",
    "tarpo/training/preemption.py:*.on_*": "TrainerCallback events: transformers' CallbackHandler calls them by name",
}


def sources(*folders: str) -> dict[str, str]:
    """``path -> text`` of the .py files under ``folders`` (relative to the checkout)."""
    found = {}
    for top in folders:
        for folder, subfolders, files in os.walk(os.path.join(ROOT, top)):
            subfolders[:] = [d for d in subfolders if d != "__pycache__"]
            found |= {os.path.relpath(os.path.join(folder, f), ROOT): open(os.path.join(folder, f)).read()
                      for f in files if f.endswith(".py")}
    return found


def references(source: str) -> tuple[set[str], set[tuple[str | None, str]]]:
    """What Python ``source`` names: (names read, imported, in ``getattr``-style calls, in strings), and
    ``(owner, attribute)`` of every ``owner.attribute``. Docstrings and comments do not count."""
    tree = ast.parse(source)
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    def last(n):
        return n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) else None

    names, attributes = set(), set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Store):
            names.add(n.id)
        elif isinstance(n, ast.Attribute):
            attributes.add((last(n.value), n.attr))
        elif isinstance(n, ast.alias):
            names.add(n.name.rsplit(".", 1)[-1])
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs:
            if re.fullmatch(r"\w+([.:]\w+)*", n.value):  # "tarpo.cli:main", ("compute_loss", ...)
                attributes |= {(None, part) for part in re.split(r"[.:]", n.value)}
                names |= set(re.split(r"[.:]", n.value)[1:])
    return names, attributes


def definitions(path: str, source: str) -> list[tuple[str, str | None, str]]:
    """``(module, class or None, name)`` of every top-level function and class and every method but dunders."""
    module = os.path.splitext(os.path.basename(path))[0]
    module = os.path.basename(os.path.dirname(path)) if module == "__init__" else module
    out = []
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.append((module, None, node.name))
        if isinstance(node, ast.ClassDef):
            out += [(module, node.name, m.name) for m in node.body
                    if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and not m.name.startswith("__")]
    return out


def used_only_by_tests(package: dict[str, str], production: list[str], tests: list[str],
                       words: set[str] = frozenset()) -> list[str]:
    """``path:name`` (``path:Class.method``) of what ``package`` defines that ``tests`` name and neither
    ``production`` (Python sources, the package's own included) nor ``words`` (of shell scripts) does. A function
    or class counts as named by ``name``, an import of it or ``module.name``; a method by any ``.name`` or a string
    naming it (``getattr(x, "name")``, a tuple of method names)."""
    def gather(texts):
        names, attributes = set(), set()
        for text in texts:
            n, a = references(text)
            names, attributes = names | n, attributes | a
        return names, attributes

    # (receiver, name) pairs that resolve elsewhere: a module's own function or class, another class's method
    elsewhere = {(module if owner is None else owner, name)
                 for path, source in package.items() for module, owner, name in definitions(path, source)}

    def named(module, owner, name, names, attributes):
        if owner is not None:  # a method: ``.name`` on what does not resolve to another definition, or a string
            return any(attribute == name and (receiver == owner or (receiver, name) not in elsewhere)
                       for receiver, attribute in attributes)
        return name in names or (module, name) in attributes

    used, in_tests = gather(production), gather(tests)
    used = (used[0] | set(words), used[1] | {(None, w) for w in words})
    return [f"{path}:{owner + '.' if owner else ''}{name}" for path, source in sorted(package.items())
            for module, owner, name in definitions(path, source)
            if named(module, owner, name, *in_tests) and not named(module, owner, name, *used)]


def test_no_production_name_is_used_only_by_tests():
    """Test oracles and helpers live in tests/, not in the package. Production: tarpo/, patches/, benchmarks/,
    scripts/, setup.py, the shell scripts and the README's Python examples (the users' code); docs/ does not
    count. What the framework calls by name is listed in CALLED_FROM_OUTSIDE, and each entry must still be needed."""
    package = sources("tarpo", "patches")
    readme = open(os.path.join(ROOT, "README.md")).read()
    production = [*package.values(), *sources("benchmarks", "scripts").values(),
                  open(os.path.join(ROOT, "setup.py")).read(), *re.findall(r"```python\n(.*?)```", readme, flags=re.S)]
    shell = [os.path.join(ROOT, top, f) for top in ("", "scripts", "benchmarks")
             for f in os.listdir(os.path.join(ROOT, top)) if f.endswith(".sh")]
    words = {w for path in shell for w in re.findall(r"\w+", re.sub(r"(^|\s)#.*", "", open(path).read()))}
    found = used_only_by_tests(package, production, list(sources("tests").values()), words)
    assert [f for f in found if not any(fnmatch.fnmatch(f, p) for p in CALLED_FROM_OUTSIDE)] == []
    assert [p for p in CALLED_FROM_OUTSIDE if not any(fnmatch.fnmatch(f, p) for f in found)] == []


def test_a_name_used_only_by_tests_is_found():
    package = {"tarpo/x.py": '"""``oracle`` is documented."""\ndef oracle(): pass\ndef used(): pass\n'
                             "def by_module(): pass\ndef by_attribute(): pass\nclass C:\n    def m(self): pass\n"
                             "    def n(self): pass\n    def by_name(self): pass\n    def __len__(self): return 0\n"}
    production = ["from tarpo.x import used\nfrom tarpo import x\nused(), x.by_module(), C().n()\n"
                  "getattr(C(), 'by_name')\nrecord.by_attribute  # oracle()\n"]
    tests = ["from tarpo.x import oracle, used, by_module, by_attribute, C\n"
             "oracle(), used(), by_module(), by_attribute(), C().m(), C().n(), C().by_name(), len(C())\n"]
    assert used_only_by_tests(package, production, tests) == ["tarpo/x.py:oracle", "tarpo/x.py:by_attribute",
                                                               "tarpo/x.py:C.m"]
    assert used_only_by_tests(package, production, tests, words={"oracle", "m"}) == ["tarpo/x.py:by_attribute"]
    # a method named like a function or another class's method is told apart by its receiver where it can be:
    # the function ``sample`` (by name and as ``y.sample``) and ``D.sample`` do not make ``C.sample`` used
    package = {"tarpo/y.py": "def sample(): pass\nclass C:\n    def sample(self): pass\n"
                             "class D:\n    def sample(self): pass\n"}
    production = ["from tarpo.y import sample\nfrom tarpo import y\nsample(), y.sample(), D.sample(None)\n"]
    tests = ["c.sample()\n"]
    assert used_only_by_tests(package, production, tests) == ["tarpo/y.py:C.sample"]
    assert used_only_by_tests(package, production + ["rng.sample(x)\n"], tests) == []  # unresolved: counted


def test_the_layout_page_is_the_tree():
    """docs/layout.md's table lists every module of the package, and every path it lists exists."""
    readme = open(os.path.join(ROOT, "docs", "layout.md")).read()
    table = readme[readme.index("| path | what |"):]
    table = table[:table.index("\n\n")] if "\n\n" in table else table
    named = set(re.findall(r"`([\w./*-]+)`", table))
    files = {os.path.relpath(p, ROOT) for p in modules().values() if not p.endswith("__init__.py")}
    files = {f for f in files if not f.startswith("patches" + os.sep)}  # patches/ is one row
    assert files - named == set(), "modules docs/layout.md does not list"
    listed = {n for n in named if "/" in n and "*" not in n}
    assert {n for n in listed if not os.path.exists(os.path.join(ROOT, n))} == set(), "listed paths that do not exist"


# a soft input's own names: its class and its table constant, read through the interface elsewhere
SOFT_INPUT_NAMES = {"TopKMixture", "HrpoGate", "GaussianSoftTokens", "GumbelTopK", "TOP_K", "HRPO_GATE", "GAUSSIAN",
                    "GUMBEL"}
SOFT_INPUT_OWNERS = {"tarpo/algorithms.py", "tarpo/engine/soft_input.py", "tarpo/engine/hrpo_gate.py"}


def soft_input_dispatch(source: str) -> list[int]:
    """The lines of ``source`` that name one soft input (SOFT_INPUT_NAMES) instead of reading the interface."""
    return sorted({n.lineno for n in ast.walk(ast.parse(source))
                   if (n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute)
                       else n.name if isinstance(n, ast.alias) else None) in SOFT_INPUT_NAMES})


def test_every_soft_input_is_one_class_and_one_row_that_the_rest_reads_through_its_interface():
    from tarpo.algorithms import MODES, ROUTINGS, SOFT_INPUTS
    from tarpo.engine.soft_input import CLASSES

    assert set(CLASSES) == set(SOFT_INPUTS) and all(CLASSES[n].kind is SOFT_INPUTS[n] for n in SOFT_INPUTS)
    assert {r.soft_input for r in ROUTINGS.values()} <= set(SOFT_INPUTS)
    assert all(hasattr(CLASSES[m.rule.soft_input], "load") for m in MODES.values())  # what tarpo eval loads
    package = {**package_sources(), **{os.path.relpath(p, ROOT): open(p).read() for n, p in modules().items()
                                       if n.startswith("tarpo.patches")}}
    assert {path: lines for path, source in package.items()
            if path not in SOFT_INPUT_OWNERS and (lines := soft_input_dispatch(source))} == {}
    assert soft_input_dispatch("from .soft_input import HrpoGate\nif isinstance(m, soft.GumbelTopK):\n"
                               "    x = rule.soft_input == GAUSSIAN\ny = m.soft_input.draw()\n") == [1, 2, 3]


def soft_input_attributes(source: str, interface: set[str]) -> list[tuple[int, str]]:
    """``(line, attribute)`` wherever ``source`` reads an attribute of a soft input (a name or attribute called
    ``soft_input`` or ``gate``) that is not the interface's (SoftInputBase's, or torch's Module's)."""
    return sorted({(n.lineno, n.attr) for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Attribute)
                   and (getattr(n.value, "id", None) or getattr(n.value, "attr", None)) in ("soft_input", "gate")
                   and n.attr not in interface})


def test_training_and_the_runs_read_a_soft_input_through_its_interface_alone():
    """No module of tarpo/training or tarpo/runs names an attribute of one variant (e.g. HRPO's Λ in the
    optimizer, its gate size in the memory plan): the soft input owns its groups, its count and its save/load."""
    import torch

    from tarpo.engine.soft_input_base import SoftInputBase
    interface = {name for name in {*dir(SoftInputBase), *dir(torch.nn.Module)} if not name.startswith("__")}
    found = {path: attrs for path, source in package_sources().items()
             if path.startswith(("tarpo/training/", "tarpo/runs/"))
             and (attrs := soft_input_attributes(source, interface))}
    assert found == {}
    assert soft_input_attributes("g = gate.lam\nk = trainer.soft_input.mixture\nsoft_input.save(d)\n",
                                 interface) == [(1, "lam"), (2, "mixture")]


def test_each_routing_rule_and_mode_is_one_entry_that_the_rest_reads():
    from tarpo.config import TarpoConfig, default
    from tarpo.runs.presets import resolve
    from tarpo.algorithms import ALGOS, MODES, ROUTINGS, inference_mode, routing_rule

    assert set(MODES[r.eval_mode].routing for r in ROUTINGS.values()) <= set(ROUTINGS)
    assert all(m.routing in ROUTINGS for m in MODES.values())
    assert all(routing_rule(r.name) is r for r in ROUTINGS.values())
    help_text = TarpoConfig.__dataclass_fields__["routing"].metadata["help"]
    assert all(f"'{name}'" in help_text for name in ROUTINGS)
    for algo, rule in ALGOS.items():
        cfg = resolve("gsm8k", {"ALGO": algo})
        assert (cfg.trainer["routing"], cfg.system, cfg.eval_mode) == (rule.name, rule.system, rule.eval_mode)
        assert ({name: cfg.trainer[name] for name in rule.settings}
                == {name: default(name) for name in rule.settings})
    with pytest.raises(ValueError, match="routing='lerned': must be one of learned, hard"):
        routing_rule("lerned")
    with pytest.raises(ValueError, match="unknown inference mode 'tarpo_sampled'"):
        inference_mode("tarpo_sampled")


def test_the_sampling_defaults_of_the_rollout_and_the_commands_are_the_configs():
    import argparse

    from tarpo.cli import case, eval as tarpo_eval
    from tarpo.config import default
    from tarpo.engine.rollout import RolloutSpec
    from tarpo.engine.router import Router
    from tarpo.evaluation.system import RUN_FLAGS, fill_run_settings

    spec = RolloutSpec(max_new_tokens=1)
    names = ("temperature", "top_k", "top_p", "soft_top_k", "routing", "entropy_threshold", "entropy_temperature",
             "answer_tag")
    assert {n: getattr(spec, n) for n in names} == {n: default(n) for n in names}
    for module, argv, flags in (
            (tarpo_eval, ["--model", "m", "--tasks", "gsm8k", "--out", "o"], tarpo_eval.SAMPLING_FLAGS),
            (case, ["--model", "m", "--task", "gsm8k", "--ids", "1", "--out", "o"],
             ("temperature", "soft_top_k", *RUN_FLAGS))):
        parser = argparse.ArgumentParser()
        module.add_arguments(parser)
        got = parser.parse_args(argv)
        assert {n: getattr(got, n) for n in RUN_FLAGS} == dict.fromkeys(RUN_FLAGS)  # unset: the run's, else ...
        fill_run_settings(got)  # ... the config's (no adapter here)
        assert {n: getattr(got, n) for n in flags} == {n: default(n) for n in flags}
    router = Router(8)
    assert router.proj.bias.tolist() == pytest.approx(default("action_bias"))
    assert router.temperature == default("action_temperature")


def test_the_three_launchers_share_one_body_that_lists_every_variable():
    """scripts/launch.sh names every variable, every ALGO and MODEL preset, and the first words of the misspelling
    rule; its comments say what a variable takes, never its default, which DRY_RUN=1 prints (the presets) and each
    launcher's generated block writes out."""
    from tarpo.algorithms import ALGOS
    from tarpo.runs.launch_variables import FAMILIES, SETTINGS, VARIABLES
    from tarpo.runs.presets import MODELS

    body = open(os.path.join(ROOT, "scripts", "launch.sh")).read()
    listed = set(re.findall(r"^([A-Z_0-9]+)=\$\{\1:-\}", body, flags=re.M))
    assert listed == set(VARIABLES) | set(SETTINGS)
    comments = dict(re.findall(r"^([A-Z_0-9]+)=\$\{\1:-\} *#(.*(?:\n {20,}#.*)*)", body, flags=re.M))
    assert set(re.findall(r"\w+", comments["ALGO"])) >= set(ALGOS)
    assert set(re.findall(r"[\w.-]+", comments["MODEL"])) >= set(MODELS)
    restated = {name: text for name, text in comments.items()
                if re.search(r"\bdefault\b(?! = [A-Z])|\(\d[\d.e-]*( h)?\)|(paper|HRPO's): \d", text)}
    assert restated == {}, "defaults restated in scripts/launch.sh (DRY_RUN=1 prints them)"
    header = body[:body.index("set -euo pipefail")]
    assert all(f"{word}_" in header for word in FAMILIES)
    from tarpo.runs.launcher_writer import END, START
    for dataset in ("gsm8k", "math", "dapo"):
        launcher = open(os.path.join(ROOT, f"run_{dataset}.sh")).read()
        assert launcher.rstrip().endswith(f'exec bash "$(dirname "$0")/scripts/launch.sh" {dataset}')
        # besides the block of the paper's values scripts/write_launchers.py writes (tests/test_launcher_values.py)
        own = launcher[:launcher.index(START)] + launcher[launcher.index(END):]
        assert len(own.splitlines()) < 20


# ---- one owner per rule: each rule is written once, in the module named here, and read everywhere else
OWNERS = {  # a name defined (a function, class or method, or assigned at a module's top level) -> its one module
    "engine_for": "tarpo/engine/engine_choice.py", "check_engine": "tarpo/engine/engine_choice.py",
    "cache_length": "tarpo/engine/functional_decoder.py", "CACHE_BUCKET": "tarpo/engine/functional_decoder.py",
    # the soft inputs' modules: the interface's default, and the variants' own answers
    "full_mixture": ("tarpo/engine/hrpo_gate.py", "tarpo/engine/soft_input.py", "tarpo/engine/soft_input_base.py"),
    "SAMPLES": "tarpo/algorithms.py",
    "sampling_problem": "tarpo/method_fields.py", "ENGINES": "tarpo/engineering_fields.py",
    "BACKENDS": "tarpo/models/loading.py",
    "DTYPES": "tarpo/models/loading.py",
    "ARCHITECTURES": "tarpo/architectures.py",
}
SHAPE_FIELDS = {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "vocab_size"}


def defined(package: dict[str, str]) -> dict[str, set[str]]:
    """name -> the files of ``package`` (path -> source) that define it: a function, class or method anywhere, or a
    name assigned at a module's top level."""
    out = {}
    for path, source in package.items():
        tree = ast.parse(source)
        names = [n.name for n in ast.walk(tree)
                 if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
        for node in tree.body:
            targets = (node.targets if isinstance(node, ast.Assign)
                       else [node.target] if isinstance(node, ast.AnnAssign) else [])
            names += [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
        for name in names:
            out.setdefault(name, set()).add(path)
    return out


def sampling_fields() -> set[str]:
    """The settings :func:`tarpo.method_fields.sampling_problem` checks: the names it asks a settings object for."""
    from tarpo.method_fields import sampling_problem

    asked = set()

    class Probe:
        def __getattr__(self, name):
            asked.add(name)
            raise AttributeError(name)

    assert sampling_problem(Probe()) is None
    return asked


def names_in(node) -> set[str]:
    return {n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(node)
            if isinstance(n, (ast.Name, ast.Attribute))}


def constants_in(node) -> set:
    return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant)}


def refuses(body) -> bool:
    """``body`` raises, calls a ``bad`` (which raises), or yields a ``(field, why)`` problem (the config's groups:
    TarpoConfig refuses the first)."""
    return any(isinstance(n, ast.Raise) or isinstance(n, ast.Call) and getattr(n.func, "id", None) == "bad"
               or isinstance(n, ast.Yield) and isinstance(n.value, ast.Tuple) for stmt in body for n in ast.walk(stmt))


def sample_counts(node) -> list:
    """What ``node`` sets the samples per question with: an ``"eval_n"`` key's value, a ``--n`` flag, ``x.n = ...``."""
    if isinstance(node, ast.Dict):
        return [v for k, v in zip(node.keys, node.values) if isinstance(k, ast.Constant) and k.value == "eval_n"]
    if isinstance(node, ast.Call) and node.args and getattr(node.args[0], "value", None) == "--n":
        return [node]
    if isinstance(node, ast.Assign) and any(isinstance(t, ast.Attribute) and t.attr == "n" for t in node.targets):
        return [node.value]
    return []


def thirty_two(node) -> bool:
    return any(type(v) is int and v == 32 or isinstance(v, str) and re.search(r"\b32\b", v)
               for v in constants_in(node))


def shape_sizes(node) -> int:
    """How many sizes of an architecture (SHAPE_FIELDS) ``node`` writes as numbers, as keywords or as dict keys."""
    pairs = [(k.arg, k.value) for k in getattr(node, "keywords", [])]
    if isinstance(node, ast.Dict):
        pairs += [(getattr(k, "value", None), v) for k, v in zip(node.keys, node.values)]
    return sum(k in SHAPE_FIELDS and isinstance(v, ast.Constant) for k, v in pairs)


# rule -> (the OWNERS name whose module may write it, None: no module; does this AST node write it, given the
# sampling fields)
RESTATED = {
    "cache bucket": ("CACHE_BUCKET", lambda n, sampling: "CACHE_BUCKET" in (
        getattr(n, "id", None), getattr(n, "attr", None), n.name if isinstance(n, ast.alias) else None)),
    "engine choice": ("engine_for", lambda n, sampling: isinstance(n, ast.IfExp) and (
        constants_in(n.body) | constants_in(n.orelse) == {"compiled", "eager"})),
    "full mixture": ("full_mixture", lambda n, sampling: isinstance(n, ast.Compare) and "full" in constants_in(n)
                     and "mixture" in ast.unparse(n)),
    "sampling check": ("sampling_problem", lambda n, sampling: isinstance(n, (ast.If, ast.For)) and refuses(
        n.body) and bool(names_in(n.test) & sampling if isinstance(n, ast.If) else constants_in(n.iter) & sampling)),
    "choices typed out": (None, lambda n, sampling: isinstance(n, ast.keyword) and n.arg == "choices" and isinstance(
        n.value, (ast.List, ast.Tuple)) and all(isinstance(e, ast.Constant) for e in n.value.elts)),
    "architecture": ("ARCHITECTURES", lambda n, sampling: shape_sizes(n) >= 3),  # a small test model's 1 or 2 are not
    "samples per question": ("SAMPLES", lambda n, sampling: any(thirty_two(v) for v in sample_counts(n))),
}


def owned_by(name: str) -> list[str]:
    """The module (or the soft inputs' modules) that OWNERS names for ``name``."""
    owner = OWNERS[name]
    return sorted(owner) if isinstance(owner, tuple) else [owner]


def restatements(path: str, source: str, sampling: set[str]) -> list[tuple[int, str]]:
    """``(line, rule)`` wherever ``source`` (the file ``path``) writes again a rule of RESTATED that another module
    owns: arithmetic on the cache bucket, a choice between the engines, the full-mixture test, a check of a
    sampling setting, a ``choices`` list typed out, a published architecture's shape, the paper's 32 samples."""
    return sorted({(node.lineno, rule) for node in ast.walk(ast.parse(source))
                   for rule, (owner, writes) in RESTATED.items()
                   if (owner is None or path not in owned_by(owner)) and writes(node, sampling)})


def package_sources() -> dict[str, str]:
    """``tarpo/...py`` -> source, for every module of the package (patches/ left out)."""
    return {os.path.relpath(path, ROOT): open(path).read() for name, path in modules().items()
            if not name.startswith("tarpo.patches")}


def test_each_rule_has_one_owner_that_the_rest_reads():
    package = package_sources()
    where = defined(package)
    assert {name: sorted(where.get(name, ())) for name in OWNERS} == {name: owned_by(name) for name in OWNERS}
    sampling = sampling_fields()
    assert sampling >= {"temperature", "top_k", "top_p", "soft_top_k", "entropy_temperature", "entropy_soft_when"}
    assert {path: found for path, source in package.items() if (found := restatements(path, source, sampling))} == {}
    from tarpo.architectures import ARCHITECTURES
    from tarpo.runs.presets import MODELS
    assert all(MODELS[name]["config"] is ARCHITECTURES[name] for name in MODELS)


def test_a_rule_written_again_is_found():
    source = """\
from .static_decode import CACHE_BUCKET
def cache_length(run):
    return -(-run.length // CACHE_BUCKET) * CACHE_BUCKET
engine = "compiled" if cuda else "eager"
full = rule.gaussian or (rule.gate and t.get("hrpo_mixture") == "full")
for name in ("temperature", "action_temperature"):
    if getattr(args, name) <= 0:
        raise ValueError(name)
if not 0 < self.top_p <= 1:
    bad("top_p", "must be in (0, 1]")
p.add_argument("--engine", choices=["auto", "eager", "compiled"])
QWEN = dict(hidden_size=1536, num_hidden_layers=28, vocab_size=151936)
cfg = {"eval_tasks": tasks, "eval_n": s.get("EVAL_N", 32)}
p.add_argument("--n", type=int, help="samples per question (default 32; greedy: 1)")
args.n = 1 if greedy else 32
if self.temperature <= 0:
    yield "temperature", "must be > 0"
"""
    assert restatements("tarpo/x.py", source, {"temperature", "top_p"}) == [
        (1, "cache bucket"), (3, "cache bucket"), (4, "engine choice"), (5, "full mixture"), (6, "sampling check"),
        (9, "sampling check"), (11, "choices typed out"), (12, "architecture"), (13, "samples per question"),
        (14, "samples per question"), (15, "samples per question"), (16, "sampling check")]
    assert defined({"tarpo/a.py": source, "tarpo/b.py": "class R:\n    def cache_length(self): pass\n"})[
        "cache_length"] == {"tarpo/a.py", "tarpo/b.py"}
    assert defined({"tarpo/a.py": "QWEN, LLAMA = {}, {}\n"}) == {"QWEN": {"tarpo/a.py"}, "LLAMA": {"tarpo/a.py"}}
    readers = """\
full_mix = rule.full_mixture(t.get("hrpo_mixture")); kl = t.get("token_kl") == "full"
p.add_argument("--engine", choices=ENGINES); p.add_argument("--dtype", choices=["auto", *DTYPES])
args.n = MODES[args.mode].samples; batch = dict(per_device_train_batch_size=32); config = ARCHITECTURES["qwen2.5-3b"]
MODEL = dict(hidden_size=128, intermediate_size=384); tokenizer = bpe_tokenizer(corpus, vocab_size=400)
if (problem := sampling_problem(args)) is not None:
    raise ValueError(problem)
if top_k > 0:
    logits = logits.topk(top_k)
"""
    assert restatements("tarpo/x.py", readers, {"temperature", "top_k"}) == []
    assert restatements("tarpo/engine/engine_choice.py", 'e = "compiled" if cuda else "eager"\n', set()) == []


def test_the_soft_input_registry_is_complete_by_construction():
    """The classes of the soft inputs are one table in tarpo.engine.soft_input, one per row of SOFT_INPUTS; the base
    module alone holds no registry to find partial (before: filled as a side effect of imports, partial with
    soft_input_base alone)."""
    import subprocess
    import sys

    code = ("import tarpo.engine.soft_input_base as base; assert not hasattr(base, 'CLASSES'); "
            "from tarpo.algorithms import SOFT_INPUTS; from tarpo.engine.soft_input import CLASSES; "
            "assert set(CLASSES) == set(SOFT_INPUTS) and all(c.kind is SOFT_INPUTS[n] for n, c in CLASSES.items())")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
