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
    # how the loss is formed (tarpo.training.objective)
    "router_aux_loss_coef": (None, "no MoE auxiliary loss is added (Qwen2 and Llama, the models served, are dense)"),
    # how completions are generated (tarpo.engine.rollout)
    "use_vllm": (False, "the hybrid decode loop feeds soft inputs, which vLLM cannot"),
    "use_transformers_paged": (False, "the hybrid decode loop is not transformers' generate"),
    "use_transformers_continuous_batching": (False, "the hybrid decode loop is not transformers' generate"),
    "repetition_penalty": (1.0, "the token policy has no repetition penalty: it would need each row's token history "
                                "([B, V] state) inside the compiled decode step, and a soft step's top-k mixture "
                                "would then come from penalised probabilities that the training forward does not "
                                "score (tarpo.engine.sampling)"),
    "cache_implementation": (None, "the rollout engines keep their own caches (eager: DynamicCache, compiled: "
                                   "a static cache of its own; rollout_engine)"),
    "num_generations_eval": (None, "evaluation groups are num_generations completions, like training's"),
    # TrainingArguments fields that the Trainer applies in code this trainer replaces
    "label_smoothing_factor": (0.0, "the loss is tarpo_loss, not a cross-entropy on labels"),
    "neftune_noise_alpha": (None, "inputs are built from E directly, past the embedding module NEFTune hooks"),
    "include_num_input_tokens_seen": ("no", "the trainer counts prompt tokens and generated units itself "
                                            "(num_tokens); a rollout batch has no input_ids to count"),
    "use_liger_kernel": (False, "Liger's fused kernels compute TRL's loss from full logits; this trainer's log-probs "
                                "come from its own chunks (tarpo.training.scoring) and its loss from "
                                "tarpo.training.objective"),
    "torch_compile": (False, "the model is not compiled (torch_compile_backend or torch_compile_mode turn this on)"),
}

# Read by the trainer (TRL's parts it keeps, or tarpo): they do what their help says.
HONOURED = {
    "model_init_kwargs", "trust_remote_code",            # TRL loads a model or reward model given by name
    "disable_dropout", "num_generations", "max_completion_length", "shuffle_dataset",
    "generation_batch_size", "steps_per_generation", "num_iterations",  # TRL's sampler and buffering
    "temperature", "top_p", "top_k", "min_p",            # tarpo.engine.rollout / tarpo.training.scoring
    "generation_kwargs",                                 # its min_p (the one key served; others refused by name)
    "chat_template_kwargs",                              # tarpo.tasks.prompts
    "beta", "epsilon", "epsilon_high", "reward_weights", "loss_type",  # tarpo.training.objective, reward plumbing
    "scale_rewards", "importance_sampling_level", "mask_truncated_completions",  # tarpo.training.objective
    "top_entropy_quantile", "sapo_temperature_neg", "sapo_temperature_pos",  # tarpo.training.objective, tarpo.losses
    "multi_objective_aggregation", "delta", "off_policy_mask_threshold",  # tarpo.training.objective, as TRL's
    "use_bias_correction_kl", "entropy_coef",            # ... for the router's terms too (docs/algorithm.md §8)
    "cast_lm_head_to_fp32",                              # TRL's cast; fp32 logits in both (Backbone.logits)
    "pad_to_multiple_of",                                # the training forward's lengths (tarpo.engine.records.padded)
    "use_adaptive_entropy", "entropy_coef_min", "entropy_coef_max", "entropy_coef_delta",  # TRL's controller
    "entropy_target",                                    # ... of entropy_coef (tarpo.training.trainer_entropy)
    "vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg",  # loss_type vespo (tarpo.losses)
    "sync_ref_model", "ref_model_mixup_alpha", "ref_model_sync_steps",  # TRL's: full fine-tuning (use_peft=False)
    "log_completions", "num_completions_to_print", "log_unique_prompts", "log_completions_hub_repo",  # TRL's log
}

# Read only when a pinned field has another value, or in a mode this trainer never enters: no effect at any value.
INERT = {
    **{name: "read only with use_vllm" for name in (
        "vllm_mode", "vllm_model_impl", "vllm_enable_sleep_mode", "vllm_structured_outputs_regex",
        "vllm_server_base_url", "vllm_server_host", "vllm_server_port", "vllm_server_timeout", "vllm_group_port",
        "vllm_gpu_memory_utilization", "vllm_max_model_length", "vllm_tensor_parallel_size",
        "vllm_importance_sampling_correction", "vllm_importance_sampling_mode", "vllm_importance_sampling_clip_max",
        "vllm_importance_sampling_clip_min", "vllm_importance_sampling_cap")},
    "transformers_continuous_batching_config": "read only with use_transformers_continuous_batching",
    "log_multimodal": "read only for images, which no prompt of this trainer holds",
    "max_tool_calling_iterations": "read only with tools, which the trainer does not take",
    "ds3_gather_for_generation": "read only by TRL's generation under DeepSpeed ZeRO-3",
    # TrainingArguments fields
    "average_tokens_across_devices": "read only with token counts from `labels`, which a rollout batch has none of; "
                                     "the loss is a mean over trajectories",
    "torch_compile_backend": "read only with torch_compile, which it turns on (pinned)",
    "torch_compile_mode": "read only with torch_compile, which it turns on (pinned)",
}
