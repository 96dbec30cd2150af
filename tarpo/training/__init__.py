"""TarpoTrainer: scoring, the objective, the optimizer, checkpoints."""
