"""TARPO: a GRPO-style trainer with a learned hard/soft input router (see README.md)."""

__version__ = "0.1.0"
