"""``--help``: every flag with nsqd's help text and pynsqd's default, as Go's ``flag`` prints it,
then the commands that run instead of the broker; and ``pynsqd export-nsqd --help``.

Flags pynsqd accepts without acting on them (:mod:`broker.config.unbuilt`) say so before
their default: ``(not built in pynsqd: ignored)``.
"""

from __future__ import annotations

from broker.config.flag import Flag
from broker.config.flag_table import FLAGS, FLAGS_BY_NAME
from broker.config.schema import Options
from broker.config.unbuilt import UNBUILT_BY_FLAG

_HELP_NOTES = {row.flag: row.help_note for row in UNBUILT_BY_FLAG.values()}

__all__ = ["export_help_text", "help_text"]

#: What ``pynsqd --help`` says after the flags: the commands that run instead of the broker,
#: and the data directory's checker.
_COMMANDS = """\
Instead of the broker:
  pynsqd bench writer|reader|channels [flags]
    \tmeasure any nsqd-compatible server; see pynsqd bench -help
  pynsqd export-nsqd -data-path=<dir> -to=<dir> [flags]
    \twrite a stopped pynsqd's queues as nsqd's files; see pynsqd export-nsqd -help
  python -m diskqueue <data-path> [queue ...]
    \tcheck the disk queues of a data directory; see python -m diskqueue --help"""

_EXPORT_USAGE = """\
Usage of pynsqd export-nsqd:
  pynsqd export-nsqd -data-path=<dir> -to=<dir> [flags]

Writes the queues of a stopped pynsqd as nsqd 1.3.0's files (nsqd.dat and go-diskqueue's
segment and metadata files) into a new or empty directory, for nsqd to start on with
-data-path=<that directory>. pynsqd's data directory keeps every message, so an interrupted
export is run again into an emptied directory. Deferred messages join their channel's queue
without their due time, dead letters are left out (a warning counts them), and a data
directory written with -durable is refused. Exit status 0, or 1 with a FATAL line.
  -data-path string
    \tpynsqd's data directory (pynsqd stopped: a running one holds its lock)
  -to string
    \tthe new or empty directory for nsqd's files"""

#: The broker's flags that change what an export writes (with -config, which may give them).
_EXPORT_FLAGS = ("config", "max-bytes-per-file", "max-msg-size", "default-priority")


def _flag_lines(flag: Flag, defaults: Options) -> list[str]:
    """A flag as Go's ``flag.PrintDefaults`` shows it: name and type, then usage and default."""
    head = f"  -{flag.name}"
    if flag.kind.type_name:
        head = f"{head} {flag.kind.type_name}"
    usage = flag.usage
    note = _HELP_NOTES.get(flag.name)
    if note:
        usage = f"{usage} ({note})"
    if flag.attr is not None:
        shown = flag.kind.help_default(getattr(defaults, flag.attr))
        if shown is not None:
            usage = f"{usage} (default {shown})"
    return [head, f"    \t{usage}"]


def help_text() -> str:
    """``--help`` output: every flag with nsqd's help text and pynsqd's default, Go style, then
    the commands that run instead of the broker."""
    defaults = Options()
    lines = ["Usage of pynsqd:"]
    for flag in FLAGS:
        lines.extend(_flag_lines(flag, defaults))
    return "\n".join([*lines, "", _COMMANDS])


def export_help_text() -> str:
    """``pynsqd export-nsqd --help``: what the export does and the flags that change what it writes."""
    defaults = Options()
    lines = [_EXPORT_USAGE]
    for name in _EXPORT_FLAGS:
        lines.extend(_flag_lines(FLAGS_BY_NAME[name], defaults))
    lines.append("The broker's other flags (pynsqd -help) are accepted, and read as the broker reads them.")
    return "\n".join(lines)
