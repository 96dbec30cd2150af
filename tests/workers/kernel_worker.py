"""One zero-advantage TARPO step at initialisation, for tests/test_kernel_settings.py: a tiny random Qwen2 with a
fresh LoRA adapter (B = 0, so the policy is the reference), a recorded batch, the trainer's scoring
(tarpo.training.scoring.score_rollout) and loss (tarpo.training.loss_inputs.rollout_loss) with every advantage 0.
Prints one JSON line: the loss, the largest |KL| of either kind, the gradient norm over LoRA and router, and the
policy's log-probs (so that runs under other kernel settings can be compared)."""

import json

import torch
from peft import LoraConfig, get_peft_model

from tarpo.engine.router import Router
from tarpo.engine.soft_input import TOP_K_MIXTURE
from tarpo.models.backends import make_backbone
from tarpo.models.tiny import char_tokenizer, synthetic_rollout, tiny_causal_lm
from tarpo.training.loss_inputs import rollout_loss
from tarpo.training.objective import LossSettings
from tarpo.training.scoring import ScoreSettings, score_rollout


def main():
    torch.manual_seed(0)
    tok = char_tokenizer()
    model = tiny_causal_lm(tok, "qwen2", hidden_size=64, layers=2, seed=0)
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj",
                                                                               "o_proj"]))
    model.train()
    router = Router(model.config.hidden_size, bias=[0.0, 0.0])
    model.base_model.model.tarpo_router = router
    ref = router.frozen_copy()
    rollout = synthetic_rollout(model.config.vocab_size, G=8, P=24, T=16, k=4, device="cpu")
    scores = score_rollout(make_backbone(model), router, ref, rollout,
                           ScoreSettings(temperature=0.7, chunk_size=64, use_router=True, with_reference=True),
                           TOP_K_MIXTURE)
    loss, _ = rollout_loss(LossSettings(lambda_act=0.1, beta=0.005, alpha=1.0), scores, rollout, torch.zeros(8))
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad and p.grad is not None]
    print(json.dumps({"loss": loss.item(), "kl_tok": scores.kl_tok.abs().max().item(),
                      "kl_act": scores.kl_act.abs().max().item(),
                      "grad_norm": torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])).item(),
                      "grads": len(grads), "logp_tok": scores.logp_tok.flatten().tolist()}))


if __name__ == "__main__":
    from tarpo.process_exit import skip_the_final_collection
    skip_the_final_collection()  # as the project's commands: no last collection over the imports
    main()
