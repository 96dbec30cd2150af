"""The ``tarpo`` command: ``tarpo <subcommand> --help`` for each."""

from __future__ import annotations

import argparse
import sys

from . import grade

COMMANDS = {"grade": grade}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tarpo", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, module in COMMANDS.items():
        module.add_arguments(sub.add_parser(name, help=module.__doc__.splitlines()[0],
                                            description=module.__doc__,
                                            formatter_class=argparse.RawDescriptionHelpFormatter))
    args = parser.parse_args(argv)
    try:
        return COMMANDS[args.command].run(args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"tarpo {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
