"""All-null columns that cost no memory of their own: every one reads one zeroed buffer.

A recording read lean (three columns of data) is put back into the sample table's 34 columns
by slicing all-null arrays. ``pa.nulls`` allocates and clears a buffer for each of them: at
2^19 rows a batch that was ~75 MiB written per process, a fifth of ``report``'s page faults.
An all-null array of these types is valid over zeros (a validity bitmap of zeros, values or
offsets of zeros, no characters, no map entries), so each is built here over the same buffer,
cleared once. Equal to ``pa.nulls`` (tests/measure/test_null_columns.py).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

__all__ = ["nulls"]

#: the widest value of a column built over the zeros (int64, float64, timestamps), in bytes
_WIDEST_BYTES = 8

_zeros: pa.Buffer | None = None
_made: dict[pa.DataType, pa.Array] = {}


def nulls(typ: pa.DataType, n: int) -> pa.Array:
    """``n`` nulls of ``typ``, equal to ``pa.nulls(n, typ)``; built once, as long as the
    longest asked for so far, and sliced (zero-copy)."""
    made = _made.get(typ)
    if made is None or len(made) < n:
        made = _made[typ] = _over_zeros(typ, n)
    return made.slice(0, n) if len(made) > n else made


def _zeros_for(n: int) -> pa.Buffer:
    """The shared zeros, at least enough for ``n`` values (and ``n + 1`` offsets)."""
    global _zeros
    size = (n + 1) * _WIDEST_BYTES
    if _zeros is None or _zeros.size < size:
        zeros = np.zeros(size, dtype=np.uint8)  # (calloc'd: pages never read stay untouched)
        zeros.setflags(write=False)  # (shared by every column: nobody may write it)
        _zeros = pa.py_buffer(zeros)
    return _zeros


def _over_zeros(typ: pa.DataType, n: int) -> pa.Array:
    zeros = _zeros_for(n)
    if pa.types.is_dictionary(typ):
        return pa.DictionaryArray.from_buffers(
            typ, n, [zeros, zeros], pa.array([], type=typ.value_type), null_count=n)
    if pa.types.is_string(typ) or pa.types.is_binary(typ):
        return pa.Array.from_buffers(typ, n, [zeros, zeros, pa.py_buffer(b"")], null_count=n)
    if pa.types.is_map(typ):
        entries = pa.array([], type=pa.struct([typ.key_field, typ.item_field]))
        return pa.Array.from_buffers(typ, n, [zeros, zeros], null_count=n, children=[entries])
    if (pa.types.is_integer(typ) or pa.types.is_floating(typ)
            or pa.types.is_timestamp(typ)) and typ.bit_width <= 8 * _WIDEST_BYTES:
        return pa.Array.from_buffers(typ, n, [zeros, zeros], null_count=n)
    return pa.nulls(n, typ)  # any other type: Arrow's own
