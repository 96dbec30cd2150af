"""Benchmarks and training data, prompts, answer extraction and grading."""
