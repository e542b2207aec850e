"""What Go does that Python does differently, in one place.

nsqd is written in Go, and clients, scripts and dashboards depend on how Go reads and
prints values. Each module mirrors one part of Go's standard library:

* :mod:`~broker.gocompat.ints` -- int32/int64/uint64 bounds and wrap-around;
* :mod:`~broker.gocompat.strconv` -- ``ParseInt``, ``ParseBool``, ``Quote`` and floats in messages;
* :mod:`~broker.gocompat.fmt` -- ``%v`` of config values;
* :mod:`~broker.gocompat.json` -- ``encoding/json``'s ``Marshal`` and ``Unmarshal``;
* :mod:`~broker.gocompat.jsonscan` -- ``encoding/json``'s syntax errors;
* :mod:`~broker.gocompat.unmarshal` -- ``json.Unmarshal`` into a struct, with its type errors;
* :mod:`~broker.gocompat.durations` -- ``time.ParseDuration`` and ``Duration.String``;
* :mod:`~broker.gocompat.regexp` -- ``regexp.Compile`` and ``MatchString`` (RE2, linear time).
"""

from broker.gocompat.durations import (
    HOUR,
    MICROSECOND,
    MILLISECOND,
    MINUTE,
    NANOSECOND,
    SECOND,
    format_duration,
    parse_duration,
    to_ns,
    to_seconds,
)
from broker.gocompat.fmt import format_v
from broker.gocompat.ints import INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN, UINT64_MAX, wrap_int64, wrap_uint64
from broker.gocompat.json import go_json, go_unmarshal, json_float, replace_surrogates
from broker.gocompat.regexp import GoRegexp, compile_go
from broker.gocompat.strconv import (
    format_float_v,
    go_quote,
    go_quote_str,
    parse_bool,
    parse_int64,
    parse_int_base0,
)

__all__ = [
    "INT32_MIN", "INT32_MAX", "INT64_MIN", "INT64_MAX", "UINT64_MAX", "wrap_int64", "wrap_uint64",
    "parse_int64", "parse_int_base0", "parse_bool", "go_quote", "go_quote_str", "format_float_v",
    "format_v",
    "go_json", "go_unmarshal", "json_float", "replace_surrogates",
    "GoRegexp", "compile_go",
    "NANOSECOND", "MICROSECOND", "MILLISECOND", "SECOND", "MINUTE", "HOUR",
    "parse_duration", "format_duration", "to_ns", "to_seconds",
]
