"""Evaluating a trained system: the pipeline of ``tarpo eval`` (planning, sampling across ranks, results with
provenance), case studies, sampling, metrics, trajectory files, the paper's tables, curves."""
