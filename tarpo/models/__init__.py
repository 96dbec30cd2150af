"""Loading a policy: base model, LoRA, router; its backend (transformers, or Unsloth with tarpo.patches)."""
