"""``python -m diskqueue DATA_PATH [NAME ...]``: verify disk queues without changing them.

Checks the named queues, or every queue found in DATA_PATH. Prints a report per queue and
exits 0 when all are OK, 1 when any has problems, 2 on usage errors (including a name
that has no queue files in DATA_PATH).
"""

from __future__ import annotations

import argparse
import sys

from .check import check
from .listing import DirectoryListing

__all__ = ["main"]

EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_USAGE = 2

#: Bytes the broker adds to a message body in its queue records at most: the 26-byte message
#: header, the 10-byte prefix of a deferred message, the 18-byte prefix saying where a
#: durable-mode record comes from and the 6-byte prefix of a priority. The default bound
#: accepts every record a broker with the default --max-msg-size writes.
BROKER_RECORD_OVERHEAD = 60
BROKER_MAX_MSG_SIZE = 1048576

_DESCRIPTION = """\
Verify disk queues without changing them: read every record from each queue's
committed cursor on, check its checksum, and compare what was found with the
queue's checkpoint."""
_EPILOG = f"""\
exit status: {EXIT_OK} when every queue checked is OK, {EXIT_PROBLEMS} when any has problems,
{EXIT_USAGE} for usage errors (an unreadable DATA_PATH, a NAME with no queue files).

A broker's data directory holds one queue per topic (NAME is the topic), one per
channel (NAME is topic:channel) and a channel's deferred and dead-letter stores
(topic:channel#deferred, topic:channel#buried)."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m diskqueue", description=_DESCRIPTION, epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("data_path", metavar="DATA_PATH",
                        help="directory holding the queue files (the broker's --data-path)")
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help="queue to check (topic, or topic:channel); default: every queue in DATA_PATH")
    parser.add_argument("--min-msg-size", type=int, default=0, metavar="BYTES",
                        help="smallest valid record; shorter ones count as damage (default: %(default)s; "
                             "the broker reads its queues with 26, the size of a message with an empty body)")
    parser.add_argument("--max-msg-size", type=int, default=BROKER_MAX_MSG_SIZE + BROKER_RECORD_OVERHEAD,
                        metavar="BYTES",
                        help="largest valid record; longer ones count as damage (default: %(default)s, the "
                             f"broker's default --max-msg-size {BROKER_MAX_MSG_SIZE} plus the "
                             f"{BROKER_RECORD_OVERHEAD} bytes it adds to a message; for a broker started with "
                             f"another --max-msg-size, give that plus {BROKER_RECORD_OVERHEAD})")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the checker; returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        listing = DirectoryListing(args.data_path)
    except OSError as exc:
        print(f"cannot read {args.data_path}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    found = listing.names()
    missing = [name for name in args.names if name not in found]
    if missing:
        listed = ", ".join(found) if found else "none"
        for name in missing:
            print(f"no disk queue named {name!r} in {args.data_path} (queues found: {listed})", file=sys.stderr)
        return EXIT_USAGE
    names = args.names or found
    if not names:
        print(f"no disk queues in {args.data_path}")
        return EXIT_OK
    status = EXIT_OK
    for name in names:
        report = check(listing.data_path, name, min_msg_size=args.min_msg_size, max_msg_size=args.max_msg_size,
                       listing=listing)
        print(report.format())
        if not report.ok:
            status = EXIT_PROBLEMS
    return status


if __name__ == "__main__":
    sys.exit(main())
