"""Go's ``regexp``: ``Compile`` and ``MatchString`` on RE2, in time linear in the text.

Python's ``re`` backtracks: ``^(a+)+$`` takes seconds on a 25-character name and grows
twofold with each character more. Go compiles the same syntax to an automaton, and so does
RE2 (the ``google-re2`` binding), so patterns from outside (an auth server's grants) mean
what they mean in nsqd and cost what they cost there. RE2's C++ parser accepts three things
Go 1.19 (nsqd 1.3.0's) refuses, refused here as Go does: ``\\C`` (any byte), the
``(?<name>...)`` group syntax (Go has ``(?P<name>...)`` only) and captures nested 1,000 deep.
RE2 refuses a program over 8 MB where Go's limit is higher (``\\pL{1000}`` compiles in Go):
such a pattern fails here. RE2's error messages are reworded as Go's:
``error parsing regexp: missing closing ): `(```.
"""

from __future__ import annotations

from functools import cache
from types import ModuleType
from typing import Any

__all__ = ["GoRegexp", "compile_go"]


@cache
def _re2() -> tuple[ModuleType, Any]:
    """The RE2 binding and the options every pattern is compiled with, loaded by the first
    pattern (only an auth server's grants have any: a start without auth skips the import)."""
    import re2

    options = re2.Options()
    options.log_errors = False  # the caller reports the error; RE2 would also print it to stderr
    options.never_capture = True  # a yes or no is all MatchString gives; spans would cost time per group
    return re2, options

#: Go's ``maxHeight``: how deep the parsed expression may nest (a literal in 999 captures).
_MAX_HEIGHT = 1000

#: RE2's error text -> Go's ``syntax.ErrorCode`` text (regexp/syntax/parse.go).
_GO_ERRORS = {
    "invalid escape sequence": "invalid escape sequence",
    "invalid character class": "invalid character class",
    "invalid character class range": "invalid character class range",
    "missing ]": "missing closing ]",
    "missing )": "missing closing )",
    "unexpected )": "unexpected )",
    "trailing \\": "trailing backslash at end of expression",
    "no argument for repetition operator": "missing argument to repetition operator",
    "invalid repetition size": "invalid repeat count",
    "bad repetition operator": "invalid nested repetition operator",
    "invalid perl operator": "invalid or unsupported Perl syntax",
    "invalid UTF-8": "invalid UTF-8",
    "invalid named capture group": "invalid named capture",
    "pattern too large - compile failed": "expression too large",
    "pattern too large - reverse compile failed": "expression too large",
}


class GoRegexp:
    """A compiled pattern; :meth:`match_string` is Go's ``MatchString``."""

    __slots__ = ("pattern", "_compiled")

    def __init__(self, pattern: str, compiled: object):
        self.pattern = pattern
        self._compiled = compiled

    def match_string(self, text: str) -> bool:
        """Whether the pattern matches anywhere in ``text`` (unanchored, as in Go)."""
        return self._compiled.search(text) is not None  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        return f"GoRegexp({self.pattern!r})"


def _go_error(code: str, arg: str) -> ValueError:
    return ValueError(f"error parsing regexp: {code}: `{arg}`")


def _refused_by_go(pattern: str) -> ValueError | None:
    r"""The error Go gives for what RE2 accepts and Go does not, or None.

    Those are ``\C``, ``(?<`` (named groups and lookbehind alike), and captures nested
    :data:`_MAX_HEIGHT` deep (Go limits the height of the parsed expression; a capture is
    one level, ``(?:...)`` none).
    """
    i, n = 0, len(pattern)
    in_class = False
    groups: list[bool] = []  # the open groups: does each capture
    captures = 0
    while i < n:
        c = pattern[i]
        if c == "\\":
            following = pattern[i + 1:i + 2]
            if following == "Q" and not in_class:  # literal text up to \E
                end = pattern.find("\\E", i + 2)
                i = n if end < 0 else end + 2
                continue
            if following == "C":
                return _go_error("invalid escape sequence", "\\C")
            i += 2
            continue
        if in_class:
            if pattern.startswith("[:", i):
                end = pattern.find(":]", i + 2)
                i = i + 1 if end < 0 else end + 2
                continue
            if c == "]":
                in_class = False
        elif c == "[":
            in_class = True
            i += 1
            if pattern.startswith("^", i):
                i += 1
            if pattern.startswith("]", i):  # a ']' first in a class is a literal
                i += 1
            continue
        elif c == "(":
            if pattern.startswith("(?<", i):  # lookbehind too: Go 1.19 stops at the '<'
                return _go_error("invalid or unsupported Perl syntax", "(?<")
            capturing = not pattern.startswith("(?", i) or pattern.startswith("(?P<", i)
            groups.append(capturing)
            captures += capturing
            if captures >= _MAX_HEIGHT:
                return _go_error("expression nests too deeply", pattern)
        elif c == ")" and groups:
            captures -= groups.pop()
        i += 1
    return None


def compile_go(pattern: str) -> GoRegexp:
    """Go's ``regexp.Compile(pattern)``; raises ``ValueError`` with Go's message for a bad pattern."""
    refused = _refused_by_go(pattern)
    if refused is not None:
        raise refused
    re2, options = _re2()
    try:
        compiled = re2.compile(pattern, options)
    except re2.error as exc:
        text = exc.args[0].decode("utf-8", "replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        code, sep, arg = text.partition(": ")
        if not sep:  # RE2 names no part of the pattern; Go quotes all of it, or nothing after a '\'
            arg = "" if code == "trailing \\" else pattern
        raise _go_error(_GO_ERRORS.get(code, code), arg) from None
    except UnicodeEncodeError:  # a lone surrogate, which no Go string holds
        raise _go_error("invalid UTF-8", ascii(pattern)) from None
    return GoRegexp(pattern, compiled)
