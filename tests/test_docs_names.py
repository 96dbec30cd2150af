"""Every name the README and the docs give a reader exists: file paths and links, modules and their functions
(``tarpo.x.y.f``, ``module.f``), launcher and environment variables, command-line flags. A rename then fails this
test instead of a reader. Output paths (``runs/...``), placeholders (``<run>``, ``*``) and other programs' flags
(pip, pytest, accelerate, git, python) are not the project's names."""

import ast
import functools
import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ["README.md", *sorted(glob.glob("docs/**/*.md", root_dir=ROOT, recursive=True)),
         *sorted(glob.glob("benchmarks/*.md", root_dir=ROOT))]
CODE_DIRS = ("tarpo", "patches", "scripts", "benchmarks", "tests", "configs", ".ci")
TOP = ("tarpo/", "tests/", "docs/", "scripts/", "benchmarks/", "configs/", "patches/", ".ci/")
PATH = re.compile(r"(?<![\w./<-])((?:%s)[\w./-]*|[\w-]+\.(?:py|sh|md|json|yaml|yml|txt|cff))(?![\w<*])"
                  % "|".join(re.escape(t) for t in TOP))
VARIABLE = re.compile(r"(?<![\w$-])\$?\{?([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+|[A-Z]{3,}[0-9]*)(?==|\b)")
FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9_-]*[a-z0-9])")
# other projects' files the pages discuss (HRPO's and the authors' scripts, transformers' and Unsloth's modules)
FOREIGN_FILES = {"hrpo_math.py", "tarpo_math.py", "tarpo_gsm8k.py", "tarpo_dapo_math.py", "modeling_qwen2.py",
                 "patch.py", "rl_replacements.py", "main.py"}
OUTPUT = r"\.(?:jsonl?|md|txt|ya?ml|html|png|pt|bin|log|tex|parquet|csv|whl|gz|gguf|safetensors|cff)$"
AMBIGUOUS = {"config", "trainer", "model", "args", "tokenizer", "self"}  # objects a page names, not the modules
# other programs' flags and variables that the pages show beside the project's
OTHERS = {"--help", "--no-deps", "--multi_gpu", "--num_processes", "--system-site-packages", "--durations",
          "--force-reinstall", "--index-url", "--extra-index-url", "--dry-run", "--report", "--upgrade",
          "--constraint", "--no-build-isolation", "--user", "--break-system-packages", "--version", "--oneline",
          "--depth", "--config_file", "--main_process_ip", "--main_process_port", "--machine_rank", "--num_machines",
          "--mixed_precision", "--no-cache-dir", "--find-links", "--no-index", "--requirement", "--editable",
          "--target", "--quiet", "--verbose", "--dest", "--only-binary", "--platform", "--python-version",
          "--implementation", "--abi", "--use-pep517", "--dist"}
OTHER_VARIABLES = {"HF_HUB_OFFLINE", "HF_TOKEN", "HF_HOME", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "PATH",
                   "PYTHONPATH", "VIRTUAL_ENV", "CONDA_PREFIX", "MKL_CBWR", "ATEN_CPU_CAPABILITY", "LOCAL_RANK",
                   "WORLD_SIZE", "RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHINDUCTOR_CACHE_DIR",
                   "TRITON_CACHE_DIR", "PIP_BREAK_SYSTEM_PACKAGES", "JSON", "CPU", "GPU", "GPUS", "RAM", "BLAS", "MKL",
                   "NCCL", "SDPA", "AVX", "API", "CLI", "PEP", "HTML", "KV", "OOM", "FSDP", "DDP", "LORA", "SFT",
                   "AMD", "EPYC", "HBM", "NVIDIA", "CUDA", "UNSLOTH_DISABLE_PINNED_MEMORY", "WANDB_PROJECT", "SLURM",
                   "SIGTERM", "SIGUSR1", "SIGINT", "SIGKILL", "TQDM_DISABLE", "NVFP4", "MXFP4", "TQ1_0", "TQ2_0",
                   "SBATCH", "CAP_SYS_PTRACE", "HAS_FLASH_ATTENTION", "HAS_TORCHVISION", "HAS_XFORMERS",
                   "DIFFUSERS_VERBOSITY", "NIBABEL_AVAILABLE"}


def spans(text: str) -> list[tuple[bool, str]]:
    """The code a page shows, inline spans and fenced blocks, each with whether it is Python source (whose dotted
    names are its own variables'; the README's example is run by tests/test_readme_example.py)."""
    blocks = [(lang == "python", body) for lang, body in re.findall(r"```([\w-]*)\n(.*?)```", text, flags=re.S)]
    inline = re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
    return blocks + [(False, span) for span in inline]


def links(text: str) -> list[str]:
    return [t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"[a-z]+:", t)]


@functools.cache
def code_text() -> str:
    """Every code file of the project, as one text (what a variable or a flag must appear in)."""
    files = [os.path.join(ROOT, f) for f in os.listdir(ROOT) if f.endswith((".sh", ".py"))]
    for top in CODE_DIRS:
        for folder, _, names in os.walk(os.path.join(ROOT, top)):
            files += [os.path.join(folder, n) for n in names if n.endswith((".py", ".sh", ".yaml", ".json", "run"))]
    this = os.path.abspath(__file__)  # its own examples of names that do not exist are no code
    return "\n".join(open(f, errors="replace").read() for f in files if os.path.abspath(f) != this)


@functools.cache
def modules() -> dict[str, str]:
    """``tarpo.x.y`` -> file, ``tarpo.patches.x`` -> patches/x.py."""
    out = {}
    for base, prefix in ((os.path.join(ROOT, "tarpo"), "tarpo"), (os.path.join(ROOT, "patches"), "tarpo.patches")):
        for folder, _, names in os.walk(base):
            for n in names:
                if n.endswith(".py"):
                    rel = os.path.relpath(os.path.join(folder, n), base)[:-3].replace(os.sep, ".")
                    out[prefix if rel == "__init__" else f"{prefix}.{rel.removesuffix('.__init__')}"] = \
                        os.path.join(folder, n)
    return out


@functools.cache
def defined(path: str) -> dict[str, set[str]]:
    """A module's top-level names, each with its members where it is a class (methods, attributes)."""
    out = {}
    for node in ast.parse(open(path).read()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out[node.name] = set()
        elif isinstance(node, ast.ClassDef):
            members = {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
            members |= {t.id for n in node.body if isinstance(n, ast.Assign) for t in n.targets
                        if isinstance(t, ast.Name)}
            members |= {n.target.id for n in node.body if isinstance(n, ast.AnnAssign)
                        and isinstance(n.target, ast.Name)}
            out[node.name] = members
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                for name in ast.walk(t):
                    if isinstance(name, ast.Name):
                        out[name.id] = set()
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out.update({(a.asname or a.name).split(".")[0]: set() for a in node.names})
    return out


def attribute_exists(path: str, rest: list[str]) -> bool:
    names = defined(path)
    return not rest or (rest[0] in names and (len(rest) == 1 or rest[1] in names[rest[0]] or rest[1] == "__init__"))


def dotted_problem(name: str) -> str | None:
    """Why ``tarpo.x.y[.f[.m]]`` or ``module.f`` (a module of the package by its last name) names nothing."""
    parts = name.rstrip("()").split(".")
    if parts[0] == "tarpo":
        for cut in range(len(parts), 0, -1):
            module = ".".join(parts[:cut])
            if module in modules():
                return None if attribute_exists(modules()[module], parts[cut:]) else f"{name}: no such name"
        return f"{name}: no such module"
    owners = [path for m, path in modules().items() if m.rsplit(".", 1)[-1] == parts[0]]
    if owners and not any(attribute_exists(path, parts[1:]) for path in owners):
        return f"{name}: no such name in {parts[0]}"
    classes = [(path, n) for path in modules().values() for n, members in defined(path).items()
               if n == parts[0] and members]
    if not owners and classes and len(parts) == 2 and not any(parts[1] in defined(p)[n] for p, n in classes):
        return f"{name}: no such member"
    return None


def field_flags() -> set[str]:
    from tarpo.config import TarpoConfig
    return {"--" + name.replace("_", "-") for name in TarpoConfig.__dataclass_fields__}


def problems(page: str, text: str) -> list[str]:
    """What ``text`` (the page ``page``, a path relative to the project) names that does not exist."""
    here, out = os.path.dirname(os.path.join(ROOT, page)), []
    code = code_text()
    for target in links(text):
        if not os.path.exists(os.path.normpath(os.path.join(here, target))):
            out.append(f"link {target}")
    flags = field_flags()
    for python, span in spans(text):
        for match in PATH.finditer(span):
            path = match.group(1).rstrip(".,:;/")
            after = span[match.end():match.end() + 1]
            bare = "/" not in path
            if (path.startswith("runs/") or not path or "..." in path or after in "*<{" and after
                    or bare and (re.search(OUTPUT, path) or path in FOREIGN_FILES)):
                continue
            exists = (os.path.exists(os.path.join(ROOT, path)) or os.path.exists(os.path.join(here, path))
                      or bare and any(f.endswith(os.sep + path) for f in all_files()))
            if not exists:
                out.append(f"path {path}")
        if python:
            continue
        for name in re.findall(r"(?<![\w./-])((?:tarpo\.)?[a-z_][a-z0-9_]*(?:\.[A-Za-z_]\w*)+)(?:\(\))?", span):
            if re.search(OUTPUT + r"|\.(py|sh)$", name) or name.split(".")[0] in AMBIGUOUS:
                continue
            why = dotted_problem(name)
            if why:
                out.append(why)
        for variable in VARIABLE.findall(span):
            if variable not in OTHER_VARIABLES and not re.search(rf"\b{variable}\b", code):
                out.append(f"variable {variable}")
        for flag in FLAG.findall(span):
            if flag not in OTHERS and flag not in flags and not re.search(rf"{flag}(?![\w-])", code):
                out.append(f"flag {flag}")
    return sorted(set(out))


@functools.cache
def all_files() -> tuple[str, ...]:
    out = []
    for folder, dirs, names in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(".venv") and d not in (".git", "runs", "node_modules")]
        out += [os.path.join(folder, n) for n in names]
    return tuple(out)


def test_every_name_the_pages_give_exists():
    found = {page: p for page in PAGES if (p := problems(page, open(os.path.join(ROOT, page)).read()))}
    assert found == {}


def test_the_checker_finds_names_that_do_not_exist():
    """Names that once stood in these pages and never existed, each found: a path, a module function, a module, a
    variable, a flag and a link."""
    text = ("`tarpo/demo.py`, `functional_decoder._merges`, `tarpo.runs.memory_plan`, `DECODE_MERGES_LEVEL=all`, "
            "`tarpo eval --adapters x`, [x](nowhere.md), and what exists: `tarpo/engine/functional_decoder.py`, "
            "`functional_decoder.cache_length`, `tarpo.engine.memory_plan.rollout_bytes`, `DECODE_MERGE=none`, "
            "`tarpo eval --adapter x`, `--max-completion-length`, [y](docs/algorithm.md)")
    assert problems("README.md", text) == ["flag --adapters", "functional_decoder._merges: no such name in "
                                           "functional_decoder", "link nowhere.md", "path tarpo/demo.py",
                                           "tarpo.runs.memory_plan: no such name", "variable DECODE_MERGES_LEVEL"]


# how the project is developed, which its pages never speak of: a tracker's issue numbers, the machines its
# developers borrow and what they do with them
DEVELOPMENT = re.compile(r"\bissues? #?\d+|\"issue\": \d+|\bdevice (?:tool|run|copy)\b|\bcarry \.whl|"
                         r"\bDEVELOPERS\.md\b|\.\./shared\b|\bgave it back\b|\bgiven back\b|\bhanded back\b|"
                         r"\bwas lent\b|\blent (?:the|a|one) GPU\b|\bworkplace\b",
                         flags=re.I)


def test_no_page_speaks_of_how_the_project_is_developed():
    """The pages and the raw results beside the GPU reports (docs/gpu/*.json)."""
    records = sorted(glob.glob("docs/gpu/*.json", root_dir=ROOT))
    found = {page: sorted(set(DEVELOPMENT.findall(open(os.path.join(ROOT, page)).read())))
             for page in PAGES + records}
    assert {page: words for page, words in found.items() if words} == {}
