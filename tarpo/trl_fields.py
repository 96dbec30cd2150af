"""How :class:`tarpo.config.TarpoConfig` treats each field it inherits from TRL's ``GRPOConfig`` (and transformers'
``TrainingArguments``): pinned to the one value that describes what runs, honoured as TRL's help says, or inert.
``tests/test_config_fields.py`` checks that every field of GRPOConfig's own is in exactly one table.
"""

from __future__ import annotations

# TarpoTrainer keeps TRL's sampler, reward plumbing, buffering, logging and
# checkpointing and replaces its generation and loss, so some inherited fields have no reader. Each field of
# GRPOConfig's own is in exactly one of the three tables below (tests/test_config_fields.py checks it); the fields of
# transformers' TrainingArguments are read by the Trainer as usual, except those pinned here.

# Pinned: the only value that describes what runs; any other value is refused, naming the field.
PINNED = {
    # how the loss and the advantages are formed (tarpo.training.objective)
    "multi_objective_aggregation": ("sum_then_normalize", "weighted rewards are summed, then normalised per group"),
    "use_bias_correction_kl": (False, "the token KL is not weighted by an importance ratio"),
    "delta": (None, "no two-sided clipping bound"),
    "off_policy_mask_threshold": (None, "no off-policy sequence masking"),
    "entropy_coef": (0.0, "no entropy bonus"),
    "use_adaptive_entropy": (False, "no entropy bonus"),
    "router_aux_loss_coef": (None, "no MoE auxiliary loss is added"),
    "sync_ref_model": (False, "the reference is the base model with the adapter disabled, never synced"),
    # how completions are generated (tarpo.engine.rollout)
    "use_vllm": (False, "the hybrid decode loop feeds soft inputs, which vLLM cannot"),
    "use_transformers_paged": (False, "the hybrid decode loop is not transformers' generate"),
    "use_transformers_continuous_batching": (False, "the hybrid decode loop is not transformers' generate"),
    "min_p": (None, "the token policy's filters are top_k and top_p only (tarpo.engine.sampling)"),
    "repetition_penalty": (1.0, "the token policy has no repetition penalty (tarpo.engine.sampling)"),
    "generation_kwargs": (None, "the hybrid decode loop takes no generate() arguments"),
    "cache_implementation": (None, "the rollout engines keep their own caches (eager: DynamicCache, compiled: "
                                   "a static cache of its own; rollout_engine)"),
    "chat_template_kwargs": (None, "prompts are encoded by tarpo.tasks.prompts with the tokenizer's chat template"),
    "pad_to_multiple_of": (None, "prompts and completions are not padded to a multiple"),
    "num_generations_eval": (None, "evaluation groups are num_generations completions, like training's"),
    "cast_lm_head_to_fp32": (False, "logits are computed in the model's dtype and cast to fp32 after"),
    "log_completions": (False, "the trainer logs its own metrics; TRL's completion tables stay empty"),
    # TrainingArguments fields that the Trainer applies in code this trainer replaces
    "label_smoothing_factor": (0.0, "the loss is tarpo_loss, not a cross-entropy on labels"),
    "neftune_noise_alpha": (None, "inputs are built from E directly, past the embedding module NEFTune hooks"),
    "include_num_input_tokens_seen": ("no", "the trainer counts prompt tokens and generated units itself "
                                            "(num_tokens); a rollout batch has no input_ids to count"),
    "use_liger_kernel": (False, "log-probs come from tarpo.training.scoring and the loss from "
                                "tarpo.training.objective"),
    "torch_compile": (False, "the model is not compiled (torch_compile_backend or torch_compile_mode turn this on)"),
}

# Read by the trainer (TRL's parts it keeps, or tarpo): they do what their help says.
HONOURED = {
    "model_init_kwargs", "trust_remote_code",            # TRL loads a model or reward model given by name
    "disable_dropout", "num_generations", "max_completion_length", "shuffle_dataset",
    "generation_batch_size", "steps_per_generation", "num_iterations",  # TRL's sampler and buffering
    "temperature", "top_p", "top_k",                     # tarpo.engine.rollout / tarpo.training.scoring
    "beta", "epsilon", "epsilon_high", "reward_weights", "loss_type",  # tarpo.training.objective, reward plumbing
    "scale_rewards", "importance_sampling_level", "mask_truncated_completions",  # tarpo.training.objective
    "top_entropy_quantile", "sapo_temperature_neg", "sapo_temperature_pos",  # tarpo.training.objective, tarpo.losses
}

# Read only when a pinned field has another value, or in a mode this trainer never enters: no effect at any value.
INERT = {
    **{name: "read only with use_vllm" for name in (
        "vllm_mode", "vllm_model_impl", "vllm_enable_sleep_mode", "vllm_structured_outputs_regex",
        "vllm_server_base_url", "vllm_server_host", "vllm_server_port", "vllm_server_timeout", "vllm_group_port",
        "vllm_gpu_memory_utilization", "vllm_max_model_length", "vllm_tensor_parallel_size",
        "vllm_importance_sampling_correction", "vllm_importance_sampling_mode", "vllm_importance_sampling_clip_max",
        "vllm_importance_sampling_clip_min", "vllm_importance_sampling_cap")},
    **{name: "read only for other loss_type values" for name in (
        "vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg")},
    **{name: "read only with use_adaptive_entropy" for name in (
        "entropy_coef_min", "entropy_coef_max", "entropy_coef_delta", "entropy_target")},
    **{name: "read only with sync_ref_model" for name in ("ref_model_mixup_alpha", "ref_model_sync_steps")},
    **{name: "read only with log_completions" for name in (
        "log_multimodal", "num_completions_to_print", "log_unique_prompts", "log_completions_hub_repo")},
    "transformers_continuous_batching_config": "read only with use_transformers_continuous_batching",
    "max_tool_calling_iterations": "read only with tools, which the trainer does not take",
    "ds3_gather_for_generation": "read only by TRL's generation under DeepSpeed ZeRO-3",
    # TrainingArguments fields
    "average_tokens_across_devices": "read only with token counts from `labels`, which a rollout batch has none of; "
                                     "the loss is a mean over trajectories",
    "torch_compile_backend": "read only with torch_compile, which it turns on (pinned)",
    "torch_compile_mode": "read only with torch_compile, which it turns on (pinned)",
}
