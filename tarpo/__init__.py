"""TARPO: a GRPO-style trainer with a learned hard/soft input router (see README.md)."""

__version__ = "0.1.0"

import logging as _logging

# bitsandbytes warns at import on CPUs with AVX512-BF16 that its optional 4-bit CPU kernel
# package is missing; TARPO never runs 4-bit layers on CPU, so the warning is noise.
_logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(_logging.ERROR)
