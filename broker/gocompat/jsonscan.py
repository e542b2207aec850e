"""Go's ``encoding/json`` syntax check (``checkValid``), for its exact error messages.

Go checks the whole document with a byte-by-byte state machine before decoding any of it,
and stops at the first byte no JSON value can continue with. The message names that byte
and the state the scanner was in: ``invalid character 'x' looking for beginning of value``,
``invalid character '}' after array element``, ``unexpected end of JSON input``. nsqd
reports a damaged ``nsqd.dat`` with these words, so pynsqd does too. The states below are
Go's, one function each; runs of string characters, digits and spaces are skipped with
regular expressions, which makes a document of long strings cheap to check.
"""

from __future__ import annotations

import re
from collections.abc import Callable

__all__ = ["syntax_error"]

#: Go's limit on nested arrays and objects.
MAX_NESTING_DEPTH = 10000

_OBJECT_KEY, _OBJECT_VALUE, _ARRAY_VALUE = range(3)
_SPACE = frozenset(b" \t\r\n")
_HEX = frozenset(b"0123456789abcdefABCDEF")
_DIGIT = frozenset(b"0123456789")
_SPACE_RUN = re.compile(rb"[ \t\r\n]+")
_STRING_RUN = re.compile(rb'[^"\\\x00-\x1f]+')
_DIGIT_RUN = re.compile(rb"[0-9]+")


def quote_char(c: int) -> str:
    """A byte as Go's ``quoteChar`` shows it: the byte read as a Latin-1 rune, in single quotes,
    escaped as ``strconv.Quote`` escapes (``'\\x00'``, ``'\\u0080'``, ``'ÿ'``)."""
    if c == 0x27:
        return "'\\''"
    if c == 0x22:
        return "'\"'"
    escapes = {7: "\\a", 8: "\\b", 12: "\\f", 10: "\\n", 13: "\\r", 9: "\\t", 11: "\\v", 0x5C: "\\\\"}
    if c in escapes:
        return f"'{escapes[c]}'"
    if 0x20 <= c <= 0x7E or (0xA1 <= c <= 0xFF and c != 0xAD):  # Go's strconv.IsPrint for Latin-1
        return f"'{chr(c)}'"
    if c < 0x20 or c == 0x7F:
        return f"'\\x{c:02x}'"
    return f"'\\u{c:04x}'"


class _Scanner:
    """Go's ``scanner``: ``step`` is the state, a function of the next byte."""

    def __init__(self) -> None:
        self.step: Callable[[int], bool] = self.begin_value
        self.stack: list[int] = []
        self.err: str | None = None
        self.end_top = False

    def then(self, state: Callable[[int], bool]) -> bool:
        """Go's ``s.step = state; return scanContinue``: the next byte goes to ``state``."""
        self.step = state
        return True

    def error(self, c: int, context: str) -> bool:
        self.step = self.failed
        self.err = f"invalid character {quote_char(c)} {context}"
        return False

    def failed(self, c: int) -> bool:
        return False

    def push(self, c: int, state: int) -> bool:
        self.stack.append(state)
        if len(self.stack) <= MAX_NESTING_DEPTH:
            return True
        return self.error(c, "exceeded max depth")

    def pop(self) -> None:
        self.stack.pop()
        if not self.stack:
            self.step = self.end_top_state
            self.end_top = True
        else:
            self.step = self.end_value

    def eof(self) -> str | None:
        if self.err is not None:
            return self.err
        if self.end_top:
            return None
        self.step(0x20)
        if self.end_top:
            return None
        return self.err or "unexpected end of JSON input"

    # -- values ----------------------------------------------------------------------

    def begin_value_or_empty(self, c: int) -> bool:
        if c in _SPACE:
            return True
        if c == 0x5D:  # ]
            return self.end_value(c)
        return self.begin_value(c)

    def begin_value(self, c: int) -> bool:
        if c in _SPACE:
            return True
        if c == 0x7B:  # {
            self.step = self.begin_string_or_empty
            return self.push(c, _OBJECT_KEY)
        if c == 0x5B:  # [
            self.step = self.begin_value_or_empty
            return self.push(c, _ARRAY_VALUE)
        literal = _LITERAL_STARTS.get(c)
        if literal is not None:
            return self.then(getattr(self, literal))
        if 0x31 <= c <= 0x39:
            return self.then(self.state1)
        return self.error(c, "looking for beginning of value")

    def begin_string_or_empty(self, c: int) -> bool:
        if c in _SPACE:
            return True
        if c == 0x7D:  # }
            self.stack[-1] = _OBJECT_VALUE
            return self.end_value(c)
        return self.begin_string(c)

    def begin_string(self, c: int) -> bool:
        if c in _SPACE:
            return True
        if c == 0x22:
            return self.then(self.in_string)
        return self.error(c, "looking for beginning of object key string")

    def end_value(self, c: int) -> bool:
        if not self.stack:
            self.step = self.end_top_state
            self.end_top = True
            return self.end_top_state(c)
        if c in _SPACE:
            return self.then(self.end_value)
        state = self.stack[-1]
        if state == _OBJECT_KEY:
            if c == 0x3A:  # :
                self.stack[-1] = _OBJECT_VALUE
                return self.then(self.begin_value)
            return self.error(c, "after object key")
        if state == _OBJECT_VALUE:
            if c == 0x2C:  # ,
                self.stack[-1] = _OBJECT_KEY
                return self.then(self.begin_string)
            if c == 0x7D:
                self.pop()
                return True
            return self.error(c, "after object key:value pair")
        if c == 0x2C:
            return self.then(self.begin_value)
        if c == 0x5D:
            self.pop()
            return True
        return self.error(c, "after array element")

    def end_top_state(self, c: int) -> bool:
        if c not in _SPACE:
            self.error(c, "after top-level value")
        return True  # Go reports it at the next call (scanEnd now)

    # -- strings ---------------------------------------------------------------------

    def in_string(self, c: int) -> bool:
        if c == 0x22:
            return self.then(self.end_value)
        if c == 0x5C:
            return self.then(self.in_string_escape)
        if c < 0x20:
            return self.error(c, "in string literal")
        return True

    def in_string_escape(self, c: int) -> bool:
        if c in b'bfnrt\\/"':
            return self.then(self.in_string)
        if c == 0x75:  # u
            return self.then(self.hex_digit(4))
        return self.error(c, "in string escape code")

    def hex_digit(self, left: int) -> Callable[[int], bool]:
        def state(c: int) -> bool:
            if c in _HEX:
                return self.then(self.in_string if left == 1 else self.hex_digit(left - 1))
            return self.error(c, "in \\u hexadecimal character escape")
        return state

    # -- numbers ---------------------------------------------------------------------

    def neg(self, c: int) -> bool:
        if c == 0x30:
            return self.then(self.state0)
        if 0x31 <= c <= 0x39:
            return self.then(self.state1)
        return self.error(c, "in numeric literal")

    def state1(self, c: int) -> bool:
        if c in _DIGIT:
            return self.then(self.state1)
        return self.state0(c)

    def state0(self, c: int) -> bool:
        if c == 0x2E:  # .
            return self.then(self.dot)
        if c in b"eE":
            return self.then(self.exponent)
        return self.end_value(c)

    def dot(self, c: int) -> bool:
        if c in _DIGIT:
            return self.then(self.dot0)
        return self.error(c, "after decimal point in numeric literal")

    def dot0(self, c: int) -> bool:
        if c in _DIGIT:
            return True
        if c in b"eE":
            return self.then(self.exponent)
        return self.end_value(c)

    def exponent(self, c: int) -> bool:
        if c in b"+-":
            return self.then(self.exponent_sign)
        return self.exponent_sign(c)

    def exponent_sign(self, c: int) -> bool:
        if c in _DIGIT:
            return self.then(self.exponent0)
        return self.error(c, "in exponent of numeric literal")

    def exponent0(self, c: int) -> bool:
        if c in _DIGIT:
            return True
        return self.end_value(c)

    # -- true, false, null -----------------------------------------------------------

    def literal(self, word: str, done: int) -> Callable[[int], bool]:
        """The state after reading ``word[:done]`` of the literal ``word``."""
        expected = ord(word[done])

        def state(c: int) -> bool:
            if c == expected:
                return self.then(self.end_value if done + 1 == len(word) else self.literal(word, done + 1))
            return self.error(c, f"in literal {word} (expecting {quote_char(expected)})")
        return state

    def t(self, c: int) -> bool:
        return self.literal("true", 1)(c)

    def f(self, c: int) -> bool:
        return self.literal("false", 1)(c)

    def n(self, c: int) -> bool:
        return self.literal("null", 1)(c)


_LITERAL_STARTS = {0x22: "in_string", 0x2D: "neg", 0x30: "state0", 0x74: "t", 0x66: "f", 0x6E: "n"}


def syntax_error(data: bytes, *, complete: bool = True) -> str | None:
    """The message of Go's ``json.Unmarshal`` for ``data`` if it is not valid JSON, else None.

    With ``complete=False`` ``data`` is the start of a document: only an error inside it is
    reported (running out of input is not one).
    """
    scanner = _Scanner()
    view = memoryview(data)
    i, end = 0, len(data)
    while i < end:
        step = scanner.step
        if step == scanner.in_string:
            run = _STRING_RUN.match(data, i)
            if run is not None:
                i = run.end()
                continue
        elif step == scanner.state1 or step == scanner.dot0 or step == scanner.exponent0:
            run = _DIGIT_RUN.match(data, i)
            if run is not None:
                i = run.end()
                continue
        elif step != scanner.end_top_state and view[i] in _SPACE and _skips_space(scanner):
            i = _SPACE_RUN.match(data, i).end()  # type: ignore[union-attr]
            continue
        if not step(view[i]):
            return scanner.err
        if scanner.err is not None:  # an error after the top-level value
            return scanner.err
        i += 1
    return scanner.eof() if complete else scanner.err


def _skips_space(scanner: _Scanner) -> bool:
    """Whether a space leaves the scanner's state as it is (so a run of them can be skipped)."""
    step = scanner.step
    return (step == scanner.begin_value or step == scanner.begin_value_or_empty
            or step == scanner.begin_string_or_empty or step == scanner.begin_string
            or (step == scanner.end_value and bool(scanner.stack)))
