"""The rollout: backbone, router, sampling, the decode step, the two engines."""
