"""The ``tarpo`` command: ``tarpo <subcommand> --help`` for each.

Subcommand modules are imported only when chosen: grading workers re-import the main
module, and ``tarpo grade`` should not pay for torch and transformers.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
import threading

COMMANDS = {"grade": "tarpo.cli.grade", "eval": "tarpo.cli.eval", "table": "tarpo.cli.table", "plot": "tarpo.cli.plot",
            "case": "tarpo.cli.case", "generate": "tarpo.cli.generate"}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog="tarpo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="{" + ",".join(COMMANDS) + "}")
    chosen = [a for a in argv[:1] if a in COMMANDS]
    for name in COMMANDS:
        if chosen and name != chosen[0]:
            sub.add_parser(name)
            continue
        module = importlib.import_module(COMMANDS[name])
        module.add_arguments(sub.add_parser(name, help=module.__doc__.splitlines()[0],
                                            description=module.__doc__,
                                            formatter_class=argparse.RawDescriptionHelpFormatter))
    args = parser.parse_args(argv)
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        # `kill` becomes a normal exit: grading pools close, multiprocessing's temp folder goes. A handler already
        # there is kept: the launch's, when EVAL=1 runs this inside it (tarpo.runs.launch_signals: status 75)
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        return importlib.import_module(COMMANDS[args.command]).run(args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"tarpo {args.command}: error: {exc}", file=sys.stderr)
        return 2


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)

