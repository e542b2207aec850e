"""Go's regexp on RE2: the patterns Go refuses, with Go's messages, and matching in linear time."""

from __future__ import annotations

import time

import pytest

from broker.gocompat import compile_go

# nsqd 1.3.0 (Go 1.19.8) logs each of these as "unable to compile topic <pattern> <message>"
GO_ERRORS = [
    ("(", "missing closing ): `(`"),
    (")", "unexpected ): `)`"),
    ("a**", "invalid nested repetition operator: `**`"),
    ("x{2}{3}", "invalid nested repetition operator: `{2}{3}`"),
    (r"\C", r"invalid escape sequence: `\C`"),
    (r"(a)\1", r"invalid escape sequence: `\1`"),
    ("(?<n>a)", "invalid or unsupported Perl syntax: `(?<`"),
    ("(?=a)", "invalid or unsupported Perl syntax: `(?=`"),
    ("a{1001}", "invalid repeat count: `{1001}`"),
    ("(a{100}){100}", "invalid repeat count: `{100}`"),
    ("[z-a]", "invalid character class range: `z-a`"),
    ("a\\", "trailing backslash at end of expression: ``"),
    ("[a", "missing closing ]: `[a`"),
    ("*", "missing argument to repetition operator: `*`"),
    ("(?P<>a)", "invalid named capture: `(?P<>`"),
    ("[[:nope:]]", "invalid character class range: `[:nope:]`"),
    (r"\pX", r"invalid character class range: `\pX`"),
    ("(" * 1000 + "a" + ")" * 1000, "expression nests too deeply: `" + "(" * 1000 + "a" + ")" * 1000 + "`"),
]


@pytest.mark.parametrize(("pattern", "message"), GO_ERRORS, ids=[p[:16] for p, _ in GO_ERRORS])
def test_patterns_go_refuses_get_gos_message(pattern: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        compile_go(pattern)
    assert str(info.value) == "error parsing regexp: " + message


@pytest.mark.parametrize(("pattern", "text", "matches"), [
    ("orders", "new_orders", True),  # anywhere, as MatchString
    ("^orders$", "orders\n", False),  # $ is the end of the text (Python's re also takes a final newline)
    (r"\Qa\C(\E", "xa\\C(y", True),  # no escapes inside \Q...\E
    (r"[\]\\C]", "C", True),
    ("[]C]", "C", True),
    ("[[:alpha:]]+(?P<n>x)", "abx", True),
    ("(" * 999 + "a" + ")" * 999, "a", True),
    ("(?:" * 5000 + "a" + ")" * 5000, "a", True),
    (r"^\d+$", "١٢", False),  # \d is ASCII only in Go
])
def test_go_syntax_matches_as_in_go(pattern: str, text: str, matches: bool) -> None:
    assert compile_go(pattern).match_string(text) is matches


def test_a_backtracking_pattern_is_matched_in_linear_time() -> None:
    # Python's re takes 0.2 s on 22 characters and doubles with each more
    pattern = compile_go("^(a+)+$")
    started = time.perf_counter()
    for _ in range(1000):
        assert not pattern.match_string("a" * 63 + "-")
    assert time.perf_counter() - started < 0.5
