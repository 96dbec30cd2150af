"""``python -m tarpo.cli <subcommand>``: the ``tarpo`` command without its console script."""

import sys

from . import main

if __name__ == "__main__":  # a worker process that re-imports the main module runs nothing
    from ..process_exit import skip_the_final_collection
    skip_the_final_collection()
    sys.exit(main())
