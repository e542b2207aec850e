"""The ``pynsqd`` command: nsqd's command line, ``pynsqd bench`` for the benchmark client, or
``pynsqd export-nsqd`` for the way back to nsqd.

``pynsqd [flags]`` parses nsqd's flags and ``--config`` file (:mod:`broker.config`), sends
the ``pynsqd`` loggers to stderr in nsqd's format, and runs the broker until SIGTERM or
SIGINT. Exit status: 0 after a normal shutdown (and for ``--help``/``--version``), 1 when
the options are unusable.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from broker.config import (
    HelpRequest,
    InfoRequest,
    InstantiateError,
    NsqdFormatter,
    OptionsError,
    configure_logging,
    export_help_text,
    parse_args,
)

if TYPE_CHECKING:
    from broker.config import Options

__all__ = ["main"]

EXIT_OK = 0
EXIT_BAD_OPTIONS = 1
#: export-nsqd's own flag, in Go's two spellings
_TO_FLAGS = ("--to=", "-to=")


def _fatal(message: str) -> None:
    # Written directly rather than through logging: the configured handler may not exist yet.
    record = logging.LogRecord("pynsqd", logging.CRITICAL, __file__, 0, message, None, None)
    print(NsqdFormatter().format(record), file=sys.stderr, flush=True)


def _options(args: list[str], usage: str | None = None) -> Options | int:
    """The options ``args`` give, or the exit status when there are none to run with (``--help``
    or ``--version`` printed, or a FATAL line for bad options). ``usage`` is what ``--help``
    prints instead of the broker's (a subcommand's own)."""
    configure_logging()  # warnings while reading the config file (unknown keys) use nsqd's format too
    try:
        return parse_args(args)
    except HelpRequest as info:
        print(info.text if usage is None else usage, flush=True)
        return EXIT_OK
    except InfoRequest as info:
        print(info.text, flush=True)
        return EXIT_OK
    except OptionsError as err:
        _fatal(f"{err.PREFIX}{err}" if isinstance(err, InstantiateError) else str(err))
        return EXIT_BAD_OPTIONS


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``pynsqd`` with ``argv`` (default ``sys.argv[1:]``); return the exit status.

    A first argument ``bench`` hands the rest to the benchmark tool, ``export-nsqd`` writes a
    stopped pynsqd's queues as nsqd's files (:mod:`broker.storage.nsqdexport`). Otherwise the options
    are parsed, logging configured, and ``broker.daemon.run(options)`` runs the broker in
    this thread until it shuts down.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "bench":
        from broker.bench import main as bench_main

        return bench_main(args[1:])
    if args and args[0] == "export-nsqd":
        return _export_nsqd(args[1:])
    options = _options(args)
    if isinstance(options, int):
        return options
    configure_logging(options.log_level, options.log_prefix)
    # The log line shows none of these; a record skips looking them up (a start with
    # thousands of topics logs a line for each).
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False

    from broker.daemon import run

    status = run(options)
    return status if isinstance(status, int) else EXIT_OK


def _export_nsqd(args: list[str]) -> int:
    """``pynsqd export-nsqd --data-path=D --to=N [nsqd's flags]``: exit status 0, or 1 with a FATAL
    line; ``--help`` prints the export's own usage."""
    import trio

    from broker.storage.nsqdexport import export_nsqd

    targets = [a.partition("=")[2] for a in args if a.startswith(_TO_FLAGS)]
    options = _options([a for a in args if not a.startswith(_TO_FLAGS)], usage=export_help_text())
    if isinstance(options, int):
        return options
    if len(targets) != 1 or not targets[0] or not options.data_path:
        _fatal("export-nsqd needs --data-path=<pynsqd's data directory> and --to=<a new directory for nsqd>")
        return EXIT_BAD_OPTIONS
    try:
        trio.run(export_nsqd, options, Path(targets[0]))
    except (OSError, RuntimeError) as exc:
        _fatal(f"export-nsqd failed - {exc}")
        return EXIT_BAD_OPTIONS
    return EXIT_OK
