"""The launchers' writer (``python scripts/write_launchers.py``): the block of variables of each ``run_<data>.sh``
(:func:`block`, between :data:`START` and :data:`END`, with a digest of its lines so that a block edited by hand is
recognised: :func:`edited_by_hand`) and the values resource, both from :mod:`tarpo.runs.presets` (which reads
``TarpoConfig``'s defaults: this module imports TRL). What a run reads of them at run time is
:mod:`tarpo.runs.launcher_values`.
"""

from __future__ import annotations

import hashlib
import re

from .launcher_values import BLOCK, FROM_ENVIRONMENT, LAUNCHED_DATA_SETS, MODEL_VARIABLES, render

START, END = "# >>> the paper's settings", "# <<< the paper's settings"


def generated_values() -> dict:
    """The paper's value of each launcher variable per data set, and per model preset (``"*"``: a model without
    one) for :data:`MODEL_VARIABLES`: what :data:`RESOURCE` holds, from the presets."""
    from .launch_variables import VARIABLES
    from .presets import DEFAULT_MODEL, MODELS, common, resolve

    field = {name: VARIABLES[name][0] for name in BLOCK if name in VARIABLES}
    out = {}
    for dataset in LAUNCHED_DATA_SETS:
        cfg = resolve(dataset, {})
        values = {"MODEL": DEFAULT_MODEL, "ALGO": cfg.algo, "EVAL": render("EVAL", cfg.eval),
                  **{name: render(name, cfg.trainer[f]) for name, f in field.items() if name not in MODEL_VARIABLES}}
        models = {m: {name: render(name, resolve(dataset, {"MODEL": m}).trainer[field[name]]) for name in
                      MODEL_VARIABLES} for m in MODELS}
        models["*"] = {name: render(name, common(cfg.algo)[field[name]]) for name in MODEL_VARIABLES}
        out[dataset] = {**values, "models": models}
    return out


def block(dataset: str, values: dict) -> str:
    """The launcher's block of variables for ``dataset`` (``values``: :func:`generated_values`)."""
    v = dict(values[dataset])
    models, default = v.pop("models"), v["MODEL"]

    def line(name, text):
        return f"{f'{name}=${{{name}:-{text}}}':<44} # {BLOCK[name]}"

    def differs(own):  # what a model's values change from the default model's
        return tuple((n, own[n]) for n in MODEL_VARIABLES if own[n] != models[default][n])
    groups: dict[tuple, list[str]] = {}  # the presets grouped by what they change
    for model, own in models.items():
        if model != "*":
            groups.setdefault(differs(own), []).append(model)
    cases = [*((names, changes, "") for changes, names in groups.items()),
             (["*"], differs(models["*"]), "  # a model without a preset")]  # last
    case = [f'case "${{MODEL,,}}" in  # the other models\' b0 and learning rates (Table 6); {default}\'s below']
    for names, changes, note in cases:
        sets = " ".join(f"{n}=${{{n}:-{t}}}" for n, t in changes)
        case.append(f"  {'|'.join(names)}) {sets + ' ' if sets else ''};;{note}")
    case.append("esac")
    words, names = [*BLOCK], []  # the variables whose value the environment set: recorded before any is filled in
    while words:
        n = next((i for i in range(len(words), 0, -1) if len(" ".join(words[:i])) <= 90), 1)
        names.append(("  " if names else f"{FROM_ENVIRONMENT}=$(for v in ") + " ".join(words[:n]) + " \\")
        words = words[n:]
    names[-1] = names[-1][:-2] + ";"
    body = "\n".join([
        *names, "  do [ -n \"${!v:-}\" ] && printf '%s ' \"$v\"; done; true)",
        line("MODEL", v["MODEL"]), line("ALGO", v["ALGO"]), *case,
        *(line(name, v[name] if name not in MODEL_VARIABLES else models[default][name])
          for name in BLOCK if name not in ("MODEL", "ALGO")),
        END])
    return "\n".join([f"{START} for {dataset} ({default}'s where they depend on the model), written by",
                      f"# scripts/write_launchers.py from tarpo/runs/presets.py (digest {_digest(body)})", body])


def _digest(body: str) -> str:
    return hashlib.sha256(body.encode()).hexdigest()[:12]


def written(text: str, dataset: str, values: dict) -> str:
    """A launcher's ``text`` with its block (between :data:`START` and :data:`END`) as :func:`block` writes it."""
    start, end = text.index(START), text.index(END) + len(END)
    return text[:start] + block(dataset, values) + text[end:]


def edited_by_hand(text: str) -> bool:
    """Whether a launcher's block differs from what the writer wrote into it: the digest its second line records
    is not that of the lines below it (a researcher edited a value), or it records none."""
    start, end = text.index(START), text.index(END) + len(END)
    head, _, rest = text[start:end].partition("\n")
    second, _, body = rest.partition("\n")
    recorded = re.search(r"\(digest ([0-9a-f]+)\)$", second)
    return recorded is None or recorded.group(1) != _digest(body)
