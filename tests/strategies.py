"""Hypothesis strategies for DPS payloads, derived from the msgspec types themselves.

Deriving them from ``msgspec.inspect`` keeps them in step with ``gateway/protocol/frames.py``: a new
field or payload is covered without touching this file.
"""

from __future__ import annotations

import functools

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
