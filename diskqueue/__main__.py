"""``python -m diskqueue DATA_PATH [NAME ...]``: verify disk queues without changing them.

Checks the named queues, or every queue found in DATA_PATH. Prints a report per queue and
exits 0 when all are OK, 1 when any has problems, 2 on usage errors.
"""

from __future__ import annotations

import argparse
import sys

from .check import check, queue_names
from .queue import DEFAULT_MAX_MSG_SIZE


def main(argv: list[str] | None = None) -> int:
    """Run the checker; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m diskqueue", description=__doc__.splitlines()[0])
    parser.add_argument("data_path", help="directory holding the queue files (nsqd's --data-path)")
    parser.add_argument("names", nargs="*", help="queue names (topic, or topic:channel); default: all")
    parser.add_argument("--min-msg-size", type=int, default=0)
    parser.add_argument("--max-msg-size", type=int, default=DEFAULT_MAX_MSG_SIZE)
    args = parser.parse_args(argv)
    try:
        names = args.names or queue_names(args.data_path)
    except OSError as exc:
        print(f"cannot read {args.data_path}: {exc}", file=sys.stderr)
        return 2
    if not names:
        print(f"no disk queues in {args.data_path}")
        return 0
    status = 0
    for name in names:
        report = check(args.data_path, name, min_msg_size=args.min_msg_size, max_msg_size=args.max_msg_size)
        print(report.format())
        if not report.ok:
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
