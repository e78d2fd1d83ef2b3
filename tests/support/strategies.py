"""Hypothesis strategies for DPS payloads, derived from the msgspec types themselves.

Deriving them from ``msgspec.inspect`` keeps them in step with ``gateway/protocol/frames.py``: a new
field or payload is covered without touching this file.
"""

from __future__ import annotations

import functools
import re

import msgspec
import msgspec.inspect as mi
from hypothesis import strategies as st

from gateway.protocol.frames import PAYLOAD_CLASSES

json_scalars = st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=20)
json_scalars |= st.floats(allow_nan=False, allow_infinity=False)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def _for(t: mi.Type) -> st.SearchStrategy:
    if isinstance(t, mi.StrType):
        return st.text(max_size=30)
    if isinstance(t, mi.BoolType):
        return st.booleans()
    if isinstance(t, mi.IntType):
        return st.integers(-(2**63), 2**63 - 1)
    if isinstance(t, mi.FloatType):
        return st.floats(allow_nan=False, allow_infinity=False)
    if isinstance(t, mi.NoneType):
        return st.none()
    if isinstance(t, mi.LiteralType):
        return st.sampled_from(t.values)
    if isinstance(t, mi.ListType):
        return st.lists(_for(t.item_type), max_size=3)
    if isinstance(t, mi.DictType):
        return st.dictionaries(st.text(max_size=8), json_values, max_size=3)
    if isinstance(t, mi.UnionType):
        return st.one_of([_for(u) for u in t.types])
    if isinstance(t, mi.StructType):
        return struct_strategy(t.cls)
    if isinstance(t, mi.RawType):
        return json_values.map(lambda v: msgspec.Raw(msgspec.json.encode(v)))
    if isinstance(t, mi.AnyType):
        return json_values
    raise TypeError(f"no strategy for {t!r}")


@functools.cache
def struct_strategy(cls: type) -> st.SearchStrategy:
    info = mi.type_info(cls)
    fields = {f.encode_name: _for(f.type) for f in info.fields}
    return st.fixed_dictionaries(fields).map(lambda kw: cls(**kw))


payloads = st.sampled_from(sorted(PAYLOAD_CLASSES)).flatmap(
    lambda t: struct_strategy(PAYLOAD_CLASSES[t])
)


# --- hostile input: what a hostile master or agent may send -----------------------------------------
#
# Deep nesting, numbers beyond a double or an int64, invalid UTF-8, JSON-like junk and every JSON
# type where another is expected; ``mutated(lines)`` plants them in real lines or frames.


def _nested(depth: int, kind: str) -> bytes:
    if kind == "array":
        return b"[" * depth + b"]" * depth
    if kind == "object":
        return b'{"a":' * depth + b"1" + b"}" * depth
    return b"[" * depth  # never closed


deep_json = st.builds(
    _nested, st.integers(100, 3000), st.sampled_from(["array", "object", "unclosed"])
)
huge_numbers = st.sampled_from(
    [b"1e400", b"-1e400", b"1e-400", b"1" + b"0" * 400, b"-" + b"9" * 5000, b"9223372036854775808"]
    + [b"NaN", b"Infinity", b"-Infinity", b"-0", b"0.0000000000000000000001", b"1E+2"]
)
invalid_utf8 = st.sampled_from(
    [b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b'"\\ud800"', b'"\\udc00x"']
)
wrong_types = st.sampled_from(
    [b"null", b"true", b"false", b"0", b"-1", b"1.5", b'""', b'"x"', b"[]", b"{}", b"[null]"]
    + [b'{"type": null}', b'[{"a": []}]']
)
hostile_values = (
    deep_json
    | huge_numbers
    | invalid_utf8
    | wrong_types
    | st.binary(max_size=12)
    | json_values.map(msgspec.json.encode)
)

# A JSON scalar right after a key: what "replace a value" swaps out.
_VALUE = re.compile(rb'\s*(?:"(?:[^"\\]|\\.)*"|-?[0-9][-0-9.eE+]*|true|false|null)')
_AFTER_KEY = re.compile(rb'":')


@st.composite
def mutated(draw: st.DrawFn, lines: list[bytes]) -> bytes:
    """One of ``lines`` with one hostile change: cut short, hostile bytes inserted, or the value
    of one key replaced by a hostile value (deep, huge, not UTF-8, of the wrong type)."""
    line = draw(st.sampled_from(lines))
    how = draw(st.sampled_from(["cut", "insert", "value", "value", "value"]))
    if how == "cut":
        return line[: draw(st.integers(0, max(0, len(line) - 1)))]
    if how == "insert":
        at = draw(st.integers(0, len(line)))
        return line[:at] + draw(hostile_values) + line[at:]
    keys = [m.end() for m in _AFTER_KEY.finditer(line)]
    if not keys:
        return line + draw(hostile_values)
    at = draw(st.sampled_from(keys))
    scalar = _VALUE.match(line, at)
    end = scalar.end() if scalar else at
    return line[:at] + draw(hostile_values) + line[end:]
