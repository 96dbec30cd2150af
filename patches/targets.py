"""The Unsloth functions the patches rely on, with the signatures they were written against.

Two checks: :func:`check_source` reads the installed source with ``ast`` (no import: Unsloth
refuses to import without a GPU, so CPU tests use this one), :func:`check` imports Unsloth and
compares ``inspect.signature`` (run before patching on a GPU). Both raise :class:`PatchError`
naming the function and the expected version.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import os
from importlib.metadata import PackageNotFoundError, version

from . import grouped_decode, training_forward
from .versions import EXPECTED_VERSIONS, PatchError


# (file under the unsloth package, dotted path of the function inside that file, its parameters)
# Nested functions are written outer.inner: the decode function is built by a factory.
TARGETS = [
    ("models/llama.py", "_LlamaModel_fast_forward_inference.LlamaModel_fast_forward_inference_custom",
     ["self", "input_ids", "past_key_values", "position_ids", "attention_mask", "**kwargs"]),
    ("models/llama.py", "_LlamaModel_fast_forward_inference",
     ["attention_fast_forward_inference", "mlp_fast_forward_inference"]),
    ("models/llama.py", "LlamaAttention_fast_forward_inference",
     ["self", "hidden_states", "past_key_value", "position_ids", "do_prefill", "attention_mask", "rotary_seq_len"]),
    ("models/llama.py", "CausalLM_fast_forward", ["fast_forward_inference"]),
    ("models/llama.py", "CausalLM_fast_forward._CausalLM_fast_forward",
     ["self", "input_ids", "causal_mask", "attention_mask", "position_ids", "past_key_values", "inputs_embeds",
      "labels", "use_cache", "output_attentions", "output_hidden_states", "return_dict", "num_logits_to_keep",
      "logits_to_keep", "*args", "**kwargs"]),
    ("models/llama.py", "LlamaModel_fast_forward",
     ["self", "input_ids", "causal_mask", "attention_mask", "position_ids", "past_key_values", "inputs_embeds",
      "use_cache", "output_attentions", "output_hidden_states", "return_dict", "*args", "**kwargs"]),
    ("models/llama.py", "FastLlamaModel.for_inference", ["model"]),
    ("models/llama.py", "FastLlamaModel.for_training", ["model", "use_gradient_checkpointing"]),
    ("models/qwen2.py", "FastQwen2Model.pre_patch", []),
]
# Module-level names the patches read at run time (module, attribute).
RUNTIME_NAMES = [("unsloth.models.llama", "LlamaModel_fast_forward_inference"),
                 ("unsloth.models.llama", "_LlamaModel_fast_forward_inference"),
                 ("unsloth.models.llama", "LlamaAttention_fast_forward_inference"),
                 ("unsloth.models.llama", "scaled_dot_product_attention"),
                 ("unsloth.models.llama", "CausalLM_fast_forward"),
                 ("unsloth.models.llama", "LlamaModel_fast_forward")]


def _params(args: ast.arguments) -> list[str]:
    names = [a.arg for a in args.posonlyargs + args.args]
    if args.vararg:
        names.append("*" + args.vararg.arg)
    names += [a.arg for a in args.kwonlyargs]
    if args.kwarg:
        names.append("**" + args.kwarg.arg)
    return names


def _find(tree: ast.AST, dotted: str):
    node, path = tree, dotted.split(".")
    for name in path:
        node = next((n for n in ast.walk(node) if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == name),
                    None)
        if node is None:
            return None
    return node


def installed_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def check_versions() -> None:
    for name, want in EXPECTED_VERSIONS.items():
        have = installed_version(name)
        if have != want:
            raise PatchError(f"tarpo.patches were written for {name}=={want}; found {have or 'none installed'} "
                             f"(pip install {name}=={want}, or BACKEND=hf for the transformers path)")


def check_source(root: str | None = None) -> None:
    """Every target exists with the expected parameters in the installed (unimported) source."""
    if root is None:
        spec = importlib.util.find_spec("unsloth")
        if spec is None or not spec.submodule_search_locations:
            raise PatchError("unsloth is not installed")
        root = list(spec.submodule_search_locations)[0]
    want_version = EXPECTED_VERSIONS["unsloth"]
    for rel, dotted, params in TARGETS:
        path = os.path.join(root, rel)
        try:
            tree = ast.parse(open(path, encoding="utf-8").read())
        except OSError:
            raise PatchError(f"unsloth/{rel} is missing (tarpo.patches expect unsloth=={want_version})") from None
        node = _find(tree, dotted)
        if not isinstance(node, ast.FunctionDef):
            raise PatchError(f"unsloth/{rel}: function {dotted} not found (tarpo.patches expect "
                             f"unsloth=={want_version})")
        got = _params(node.args)
        if dotted.endswith("pre_patch"):
            continue  # a staticmethod/classmethod without arguments of interest: existence suffices
        if got != params:
            raise PatchError(f"unsloth/{rel}: {dotted}{tuple(got)} differs from the expected {tuple(params)} "
                             f"(tarpo.patches expect unsloth=={want_version})")
        if dotted == grouped_decode.TARGET:
            grouped_decode.check_target(ast.unparse(node))
        if dotted == training_forward.TARGET:
            training_forward.check_target(ast.unparse(node))


def check() -> None:
    """Versions, then the imported targets' signatures (needs a GPU: Unsloth does not import without one)."""
    check_versions()
    check_source()
    import importlib

    for module, name in RUNTIME_NAMES:
        obj = getattr(importlib.import_module(module), name, None)
        if obj is None or not callable(obj):
            raise PatchError(f"{module}.{name} is missing (tarpo.patches expect unsloth=="
                             f"{EXPECTED_VERSIONS['unsloth']})")
    fast = importlib.import_module("unsloth.models.llama").LlamaModel_fast_forward_inference
    got = list(inspect.signature(fast).parameters)
    if got[:4] != ["self", "input_ids", "past_key_values", "position_ids"]:
        raise PatchError(f"unsloth.models.llama.LlamaModel_fast_forward_inference{tuple(got)} has changed "
                         f"(tarpo.patches expect unsloth=={EXPECTED_VERSIONS['unsloth']})")
