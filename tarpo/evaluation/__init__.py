"""Sampling a trained system, metrics, trajectory files, the paper's tables, curves."""
