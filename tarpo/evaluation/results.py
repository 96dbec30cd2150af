"""The results of one evaluated task: every metric of docs/algorithm.md §7 and the provenance
(model, adapter, task, n, settings, seed, grader and versions, packages, date), as
``tarpo eval`` writes them to ``<task>.results.json``, and the one-line summary it prints.
For ``math`` the MATH-500 subset is reported from the same run when the MATH-500 ids can be loaded."""

from __future__ import annotations

import os
from datetime import datetime, timezone

from ..patches.targets import installed_version
from ..algorithms import MODES
from ..tasks.graders import canonical_answers, grader_versions
from ..tasks.registry import TASKS, load_task
from .sample import summarize
from .trajectories import TrajectoryFile

PACKAGES = ("tarpo", "torch", "transformers", "peft", "trl", "math-verify")


def package_versions(names=PACKAGES) -> dict:
    """Installed version of each named distribution (None where absent), for provenance."""
    return {name: installed_version(name) for name in names}


def _math500_ids(args) -> tuple[set[str] | None, str]:
    path = args.data_dir and os.path.join(args.data_dir, "math500")
    try:
        return {ex["id"] for ex in load_task("math500", path)}, path or TASKS["math500"].hub_id
    except Exception as exc:  # noqa: BLE001 - the subset is optional; say why it is missing
        return None, f"unavailable: {exc}"


def task_results(args, task: str, traj: TrajectoryFile, device, rate: float, world: int = 1) -> dict:
    """The metrics and provenance of a task whose trajectories are all on disk."""
    saved = traj.settings  # the task's settings, as its trajectory file records them
    records = traj.records
    canonical = canonical_answers([r["answer"] for r in records], task)
    metrics = summarize(records, args.ks, canonical)
    subsets = {}
    if task == "math":
        ids, where = _math500_ids(args)
        if ids is None:
            subsets["math500"] = {"error": where}
        else:
            keep = [j for j, r in enumerate(records) if r["id"] in ids]
            if keep:
                subsets["math500"] = {**summarize([records[j] for j in keep], args.ks, [canonical[j] for j in keep]),
                                      "ids_from": where}
    return {
        "task": task, "system": args.system or MODES[args.mode].system,
        "model_name": args.model_name or os.path.basename(os.path.normpath(args.model)),
        "model": args.model, "adapter": args.adapter, "mode": args.mode, "n": args.n, "seed": args.seed,
        "metrics": metrics, "subsets": subsets, "settings": saved, "grader": grader_versions(saved["grader"]),
        "packages": package_versions(), "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device": str(device), "processes": world, "samples_per_s": rate,
        "trajectories": os.path.basename(traj.path),
    }


def summary_line(res: dict) -> str:
    """The line ``tarpo eval`` prints for one task's results."""
    m = res["metrics"]
    parts = [f"{k} {m[k]:.4f}" for k in m if k.startswith(("pass@", "maj@"))]
    line = (f"{res['task']}: " + " ".join(parts) + f" sd {m['accuracy_sd']:.4f} ci95 {m['accuracy_ci95']:.4f} "
            f"units {m['units']:.1f} hard {m['hard_tokens']:.1f} soft_ratio {m['soft_ratio']:.4f} "
            f"({m['questions']} questions x {res['n']} samples)")
    sub = res["subsets"].get("math500")
    if sub and "pass@1" in sub:
        line += f"; math500 subset pass@1 {sub['pass@1']:.4f} ({sub['questions']} questions)"
    return line
