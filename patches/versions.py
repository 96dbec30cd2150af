"""The Unsloth release the patches are written against, and the error every patch check raises."""

EXPECTED_VERSIONS = {"unsloth": "2026.10.7", "unsloth_zoo": "2026.10.7"}


class PatchError(RuntimeError):
    """An installed library is not what a patch was written against (the message names what and where)."""
