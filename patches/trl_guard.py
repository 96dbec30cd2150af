"""Guard against Unsloth's rewrite of TRL's GRPOTrainer.

Target: ``unsloth.models.rl.PatchFastRL`` (run by ``import unsloth``) rebinds
``trl.GRPOTrainer`` / ``trl.trainer.grpo_trainer.GRPOTrainer`` to a regenerated
``UnslothGRPOTrainer`` whose ``compute_loss`` never calls ``_compute_loss`` and whose
``_generate_and_score_completions``, ``_prepare_inputs`` and log-prob methods are rewritten.
TARPO subclasses TRL's own class: :func:`pristine_grpo_trainer` returns it and refuses (with
the fix) when Unsloth was imported first; :func:`check_overrides` verifies, when a trainer is
built and when it trains, that TARPO's overrides are the functions that run (not replaced on
the instance, not resolved to an Unsloth class, not carrying Unsloth's wrapper markers).
"""

from __future__ import annotations

import inspect

from .versions import PatchError

PROTECTED = ("_generate_and_score_completions", "_compute_loss", "compute_loss", "create_optimizer",
             "_save_checkpoint", "_load_from_checkpoint")


def _is_unsloth(cls) -> bool:
    return cls.__name__.startswith(("Unsloth", "_Unsloth")) or not cls.__module__.startswith("trl")


def pristine_grpo_trainer():
    """TRL's ``GRPOTrainer`` class, as TRL defines it."""
    import trl.trainer.grpo_trainer as grpo

    cls = grpo.GRPOTrainer
    if _is_unsloth(cls):
        raise PatchError(f"trl.GRPOTrainer is {cls.__module__}.{cls.__name__}: unsloth was imported before "
                         "tarpo.training.trainer and replaced TRL's trainer. Import tarpo (or tarpo.training.trainer) "
                         "before unsloth; tarpo.models.loading imports unsloth itself when the Unsloth backend "
                         "is used.")
    return cls


def _defined_by_us(owner, name):
    """The class of ``owner``'s MRO whose ``name`` ``owner`` runs when it is the project's (``owner`` itself or one
    of its mixins, e.g. tarpo.training.trainer_checkpoints), else None (TRL's or transformers' own method)."""
    cls = next((c for c in owner.__mro__ if name in c.__dict__), None)
    return None if cls is None or cls.__module__.startswith(("trl.", "transformers.")) else cls


def check_overrides(trainer, owner) -> None:
    """Raise :class:`PatchError` unless every PROTECTED method that ``owner`` (or a mixin of it) defines runs as
    defined."""
    bad = [c for c in type(trainer).__mro__ if c.__name__.startswith(("Unsloth", "_Unsloth"))]
    if bad:
        raise PatchError(f"{type(trainer).__name__} inherits from {bad[0].__module__}.{bad[0].__name__} "
                         "(Unsloth's rewrite of TRL's GRPOTrainer); import tarpo before unsloth")
    for name in PROTECTED:
        ours = _defined_by_us(owner, name)
        if ours is None:
            continue
        if name in vars(trainer):
            raise PatchError(f"{name} of {type(trainer).__name__} was replaced on the instance by "
                             f"{vars(trainer)[name]!r}")
        static = inspect.getattr_static(type(trainer), name)
        defined_by = next(c for c in type(trainer).__mro__ if name in c.__dict__)
        if not (issubclass(defined_by, owner) or defined_by is ours):
            raise PatchError(f"{name} of {type(trainer).__name__} resolves to {defined_by.__qualname__}.{name}")
        markers = [a for a in getattr(static, "__dict__", {}) if a.startswith("_unsloth")]
        if markers:
            raise PatchError(f"{name} of {type(trainer).__name__} carries Unsloth's wrapper markers {markers}")
