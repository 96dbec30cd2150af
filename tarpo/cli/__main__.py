"""``python -m tarpo.cli <subcommand>``: the ``tarpo`` command without its console script."""

import sys

from . import main


def command() -> int:
    """The ``tarpo`` command in a process of its own (the console script's entry point, and ``python -m``): it
    ends without the last collection over its imports (tarpo.process_exit)."""
    from ..process_exit import skip_the_final_collection
    skip_the_final_collection()
    return main()


if __name__ == "__main__":  # a worker process that re-imports the main module runs nothing
    sys.exit(command())
