"""Just enough Matroska (EBML) walking to rewrite block timestamps for the
`non_monotonic_timestamps` defect. Pure bytes in, bytes out."""

from __future__ import annotations

SEGMENT = 0x18538067
CLUSTER = 0x1F43B675
SIMPLE_BLOCK = 0xA3
BLOCK_GROUP = 0xA0
BLOCK = 0xA1
_CONTAINERS = {SEGMENT, CLUSTER, BLOCK_GROUP}


def _vint_length(first: int) -> int:
    mask, length = 0x80, 1
    while length <= 8 and not first & mask:
        mask >>= 1
        length += 1
    if length > 8:
        raise ValueError("invalid EBML variable-length integer")
    return length


def _read_id(buf: bytes | bytearray, pos: int) -> tuple[int, int]:
    length = _vint_length(buf[pos])
    return int.from_bytes(buf[pos : pos + length], "big"), length


def _read_size(buf: bytes | bytearray, pos: int) -> tuple[int | None, int]:
    length = _vint_length(buf[pos])
    value = buf[pos] & (0xFF >> length)
    for i in range(1, length):
        value = (value << 8) | buf[pos + i]
    unknown = value == (1 << (7 * length)) - 1
    return (None if unknown else value), length


def block_timestamp_offsets(buf: bytes | bytearray) -> list[int]:
    """Byte offsets of the int16 relative timestamp of every (Simple)Block, in file order."""
    found: list[int] = []

    def walk(start: int, end: int) -> None:
        pos = start
        while pos < end:
            element, id_len = _read_id(buf, pos)
            size, size_len = _read_size(buf, pos + id_len)
            body = pos + id_len + size_len
            stop = end if size is None else min(end, body + size)
            if element in _CONTAINERS:
                walk(body, stop)
            elif element in (SIMPLE_BLOCK, BLOCK):
                track_len = _vint_length(buf[body])
                found.append(body + track_len)
            pos = stop

    walk(0, len(buf))
    return found


def shift_block_timestamps(data: bytes, first: int, count: int, delta_ms: int) -> bytes:
    """Add `delta_ms` to the relative timestamps of blocks [first, first+count)."""
    buf = bytearray(data)
    offsets = block_timestamp_offsets(buf)[first : first + count]
    for off in offsets:
        value = int.from_bytes(buf[off : off + 2], "big", signed=True) + delta_ms
        value = max(-32768, min(32767, value))
        buf[off : off + 2] = value.to_bytes(2, "big", signed=True)
    return bytes(buf)
