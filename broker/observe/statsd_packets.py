"""Packing statsd lines into UDP packets as nsqd 1.3.0 does (``internal/writers``).

nsqd writes each line through a ``bufio.Writer`` of ``--statsd-udp-packet-size`` bytes
that is flushed before a line that does not fit in what is left of it: a packet holds
whole lines, in order, as many as fit. A line longer than the packet size is sent alone
in a packet of its own (``bufio`` writes it straight through), so that one packet is
larger than the size.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["DEFAULT_PACKET_SIZE", "pack_lines", "packet_size"]


#: The packet size nsqd uses for ``--statsd-udp-packet-size`` of 0 or less: its buffered
#: writer's default (Go's ``bufio.NewWriterSize`` takes any size <= 0 as 4096).
DEFAULT_PACKET_SIZE = 4096


def packet_size(configured: int) -> int:
    """The bytes per packet for ``--statsd-udp-packet-size``, as nsqd reads it."""
    return configured if configured > 0 else DEFAULT_PACKET_SIZE


def pack_lines(lines: Iterable[bytes], packet_size: int) -> list[bytes]:
    """The packets that carry ``lines`` (each ending in a newline), in order."""
    packets: list[bytes] = []
    pending: list[bytes] = []
    used = 0
    for line in lines:
        if len(line) > packet_size - used:
            if pending:
                packets.append(b"".join(pending))
                pending = []
                used = 0
            if len(line) > packet_size:
                packets.append(line)
                continue
        pending.append(line)
        used += len(line)
    if pending:
        packets.append(b"".join(pending))
    return packets
