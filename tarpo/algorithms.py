"""The routing rules and the inference modes: one table each (docs/algorithm.md §1-3).

A **routing rule** says how the decode step (:mod:`tarpo.engine.step`) picks ``d_t`` at a thinking step,
what a soft step feeds, what training learns besides the LoRA backbone, and how a model trained
with it is evaluated. Every trained system of the paper is one rule of the same trainer; its
``algo`` is the launchers' ``ALGO`` and its ``system`` the name ``tarpo table`` prints.

An **inference mode** (``tarpo eval --mode``) runs a trained model under one rule, sampled or
greedy; ``system`` is the name of its column in the paper's tables.

Nothing here imports torch, so the table renderer (:mod:`tarpo.evaluation.tables`) reads it too.

    >>> ROUTINGS["learned"].trains, ROUTINGS["hrpo"].trains, MODES["tarpo_greedy"].routing
    ('router', 'hrpo_gate', 'learned')
    >>> [r.algo for r in ROUTINGS.values()]
    ['tarpo', 'grpo', 'grpo_pure_latent', 'grpo_entropy', 'hrpo', 'soft_tokens', 'tarpo_gumbel']
"""

from __future__ import annotations

from dataclasses import dataclass

# how d_t is picked at a thinking step
NEVER = "never"        # always hard
ALWAYS = "always"      # soft at every thinking step
ENTROPY = "entropy"    # soft iff the entropy of softmax(z_t / entropy_temperature) > entropy_threshold (or <)
ROUTER = "router"      # drawn from the router rho(.|h_t) (argmax in the greedy modes)

# what a soft step feeds (SOFT_INPUTS below; each one class of tarpo.engine.soft_input)
TOP_K = "top_k"              # the top-k mixture of tarpo.engine.mixture
HRPO_GATE = "hrpo_gate"      # HRPO's gated blend of E(v_t) and a mixture
GAUSSIAN = "gaussian"        # Soft Tokens' full mixture plus noise
GUMBEL = "gumbel_top_k"      # the top-k mixture with Gumbel-softmax weights
# the mixture HRPO's gate blends (TarpoConfig.hrpo_mixture, tarpo.engine.soft_input.HrpoGate)
HRPO_MIXTURES = ("full", "top_k")


@dataclass(frozen=True)
class SoftInput:
    """What a soft step feeds: the facts about it that a configuration is checked and a run planned with before any
    model exists. Its code (how a step's input is drawn, how training rebuilds it, its log-density) is the class of
    :mod:`tarpo.engine.soft_input` registered under the same ``name``."""

    name: str                      # Routing.soft_input
    help: str
    feeds_token: bool = False      # a soft step still feeds E(v_t) (a blend): its token keeps its policy-gradient term
    log_density: bool = False      # its input is a random draw whose log-density is in the policy gradient: valid
    #                                only for the policy that drew it, so trained on-policy only
    trained: bool = False          # it has parameters of its own, trained with the policy and saved beside the adapter


SOFT_INPUTS = {s.name: s for s in (
    SoftInput(TOP_K, "the top-k mixture of the tempered token distribution (TARPO, Pure Latent, Entropy Routing)"),
    SoftInput(HRPO_GATE, "HRPO's gated blend of E(v_t) and a mixture", feeds_token=True, trained=True),
    SoftInput(GAUSSIAN, "Soft Tokens' full mixture plus Gaussian noise", log_density=True),
    SoftInput(GUMBEL, "the top-k mixture with Gumbel-softmax weights", log_density=True),
)}


@dataclass(frozen=True)
class Routing:
    name: str         # TarpoConfig.routing
    soft_when: str    # NEVER, ALWAYS, ENTROPY or ROUTER
    soft_input: str   # what a soft step feeds: a name of SOFT_INPUTS
    algo: str         # the launchers' ALGO that trains with it
    system: str       # its name in tarpo table
    eval_mode: str    # the inference mode its trained model is evaluated with (MODES)
    help: str
    settings: tuple = ()  # the TarpoConfig fields of this rule's own (shown in a launcher's resolved configuration)

    @property
    def router(self) -> bool:
        """The router decides, so training learns it and evaluation needs it."""
        return self.soft_when == ROUTER

    @property
    def trains(self) -> str:
        """What training learns besides the LoRA backbone: "router", the soft input's parameters (its name) or ""."""
        return "router" if self.router else self.soft_input if self.soft.trained else ""

    @property
    def soft(self) -> SoftInput:
        """What a soft step feeds (its facts; its code: ``tarpo.engine.soft_input.soft_input_class(name)``)."""
        return SOFT_INPUTS[self.soft_input]


ROUTINGS = {r.name: r for r in (
    Routing("learned", ROUTER, TOP_K, "tarpo", "TARPO", "tarpo",
            "the router samples hard/soft (TARPO)"),
    Routing("hard", NEVER, TOP_K, "grpo", "GRPO", "cot",
            "always the sampled token (GRPO, CoT)"),
    Routing("soft", ALWAYS, TOP_K, "grpo_pure_latent", "GRPO w/ Pure Latent", "pure_latent",
            "always the top-k mixture (Pure Latent)"),
    Routing("entropy", ENTROPY, TOP_K, "grpo_entropy", "GRPO w/ Entropy Routing", "entropy",
            "soft iff token entropy > entropy_threshold (Entropy Routing; entropy_soft_when=low: below it)",
            ("entropy_threshold", "entropy_temperature", "entropy_soft_when")),
    Routing("hrpo", ALWAYS, HRPO_GATE, "hrpo", "HRPO", "hrpo",
            "HRPO's gated blend of E(v_t) and the mixture at every thinking step",
            ("hrpo_mixture", "hrpo_lr", "hrpo_lambda_lr", "hrpo_c")),
    # "Soft Tokens, Hard Truths": trained with noisy soft inputs, evaluated with hard inputs
    Routing("soft_tokens", ALWAYS, GAUSSIAN, "soft_tokens", "Soft Tokens", "hard",
            "the full mixture plus Gaussian noise at every thinking step (Soft Tokens)",
            ("soft_tokens_noise_scale",)),
    # exploration inside the soft mode (docs/algorithm.md §8): trained with perturbed mixtures, evaluated as TARPO
    Routing("learned_gumbel", ROUTER, GUMBEL, "tarpo_gumbel", "TARPO w/ Gumbel", "tarpo",
            "the router samples hard/soft; a soft step's top-k weights are a Gumbel-softmax draw (SofT-GRPO-style)",
            ("gumbel_temperature",)),
)}
ALGOS = {r.algo: r for r in ROUTINGS.values()}


SAMPLES = 32  # samples per question of a sampled mode: the paper's n, of pass@32 and maj@32 (docs/algorithm.md §7)


@dataclass(frozen=True)
class Mode:
    name: str         # tarpo eval --mode
    routing: str      # the rule it decodes with (ROUTINGS)
    system: str       # the column's name in the paper's tables
    greedy: bool = False  # argmax tokens (and argmax routing), one sample per question
    help: str = ""

    @property
    def rule(self) -> Routing:
        return ROUTINGS[self.routing]

    @property
    def samples(self) -> int:
        """Samples per question unless asked otherwise (``tarpo eval --n``, the launchers' ``EVAL_N``)."""
        return 1 if self.greedy else SAMPLES


MODES = {m.name: m for m in (
    Mode("cot", "hard", "CoT", help="hard inputs throughout"),
    Mode("hard", "hard", "TARPO (hard inputs)", help="a trained model forced to hard routing"),
    Mode("pure_latent", "soft", "Pure Latent", help="soft at every thinking step"),
    Mode("entropy", "entropy", "Entropy-Routed", help="soft where the token entropy is above the threshold"),
    Mode("tarpo", "learned", "TARPO", help="the trained router samples each step's input"),
    Mode("hrpo", "hrpo", "HRPO", help="HRPO's trained gate at every thinking step"),
    Mode("greedy", "hard", "Greedy", greedy=True, help="argmax tokens, one sample"),
    Mode("tarpo_greedy", "learned", "TARPO", greedy=True, help="argmax tokens and argmax routing, one sample"),
)}


RULE_SETTINGS = "routing_settings.json"  # beside a saved adapter: the rule it was trained with, its own settings and
#                                          the chat template's arguments (chat_template_kwargs) where the run had any


def rule_settings(config) -> dict:
    """What a trained adapter keeps of its run's routing (:data:`RULE_SETTINGS`): the rule's name and its own settings
    (``Routing.settings``), which evaluation decodes with unless told otherwise (``tarpo eval``, ``tarpo case``), and
    TRL's ``chat_template_kwargs`` where the run set any (evaluation's prompts are templated as training's were).

        >>> from types import SimpleNamespace as NS
        >>> rule_settings(NS(routing="entropy", entropy_threshold=0.7, entropy_temperature=1.0,
        ...                  entropy_soft_when="high"))
        {'routing': 'entropy', 'entropy_threshold': 0.7, 'entropy_temperature': 1.0, 'entropy_soft_when': 'high'}
    """
    template = getattr(config, "chat_template_kwargs", None)
    return {"routing": config.routing, **{name: getattr(config, name) for name in ROUTINGS[config.routing].settings},
            **({"chat_template_kwargs": dict(template)} if template else {})}


def routing_rule(name: str, setting: str = "routing") -> Routing:
    """The routing rule called ``name``; an unknown name is refused naming ``setting``."""
    if name not in ROUTINGS:
        raise ValueError(f"{setting}={name!r}: must be one of {', '.join(ROUTINGS)}")
    return ROUTINGS[name]


def inference_mode(name: str) -> Mode:
    """The inference mode called ``name``; an unknown name is refused, listing the known ones."""
    if name not in MODES:
        raise ValueError(f"unknown inference mode {name!r}; known: {', '.join(MODES)}")
    return MODES[name]
