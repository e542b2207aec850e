"""``--help``: every flag with nsqd's help text and pynsqd's default, as Go's ``flag`` prints it.

Flags pynsqd accepts without acting on them (:mod:`broker.config.unbuilt`) say so before
their default: ``(not built in pynsqd: ignored)``.
"""

from __future__ import annotations

from broker.config.flag_table import FLAGS
from broker.config.schema import Options
from broker.config.unbuilt import UNBUILT_BY_FLAG

_HELP_NOTES = {row.flag: row.help_note for row in UNBUILT_BY_FLAG.values()}

__all__ = ["help_text"]


def help_text() -> str:
    """``--help`` output: every flag with nsqd's help text and pynsqd's default, Go style."""
    defaults = Options()
    lines = ["Usage of pynsqd:"]
    for flag in FLAGS:
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
        lines.append(head)
        lines.append(f"    \t{usage}")
    lines.append("")
    lines.append("pynsqd bench [flags] runs the benchmark client instead; see pynsqd bench -help.")
    return "\n".join(lines)
