"""The statsd push loop: every ``--statsd-interval``, the broker's stats as UDP packets.

As nsqd 1.3.0 (``nsqd/statsd.go``): the first push comes one interval after start; each
push opens a UDP socket to ``--statsd-address`` (resolving the name, within a second),
takes one stats snapshot, writes its lines (:mod:`~broker.observe.statsd_lines`) packed
into packets (:mod:`~broker.observe.statsd_packets`) and spreads the packets evenly over
the interval less one second, so a large broker does not send them in one burst.

Nothing here can hold up the broker: the loop is its own task, a snapshot is taken
without awaiting, and a send that fails (no receiver, an unreachable host, a packet too
large) is logged and the push goes on. nsqd's spreading of the packets panics with an
interval of one second or less; here such a push sends its packets at once.
"""

from __future__ import annotations

import logging
import math
import socket

import trio

from broker.gocompat.netaddr import lookup_port, split_host_port
from broker.observe.collect import snapshot
from broker.observe.runtime import GC_PAUSES, memory_stats
from broker.observe.sources import BrokerSource
from broker.observe.statsd_lines import FIRST_PUSH, PushState, statsd_lines
from broker.observe.statsd_packets import pack_lines, packet_size

__all__ = ["DIAL_TIMEOUT", "SPREAD_MARGIN", "StatsdPusher", "split_address"]

log = logging.getLogger("pynsqd.statsd")

#: Seconds a push may spend resolving ``--statsd-address`` (nsqd's ``net.DialTimeout``).
DIAL_TIMEOUT = 1.0

#: The part of each interval left free after a push's packets have been spread (nsqd's one second).
SPREAD_MARGIN = 1.0


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port``) into its parts as Go's dial reads it (an empty port is 0, a
    name is looked up as a UDP service); raises :class:`~broker.gocompat.netaddr.AddrError` (a
    ``ValueError``) where the dial would refuse it (``address 99999: invalid port``)."""
    host, port = split_host_port(address)
    return host, lookup_port("udp", port)


class StatsdPusher:
    """Pushes ``broker``'s stats to statsd until cancelled.

    The settings are read from ``broker.options`` at each push, as nsqd reads them, the
    interval once at start; ``statsd_prefix`` must already be expanded
    (:func:`~broker.observe.statsd_prefix.statsd_prefix`). :meth:`run` owns the UDP
    socket of each push and closes it before the next.
    """

    def __init__(self, broker: BrokerSource):
        self.broker = broker
        self.interval = broker.options.statsd_interval
        self.pushes = 0
        self._last: PushState = FIRST_PUSH

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Push once per interval until cancelled; reports started at once."""
        GC_PAUSES.install()
        try:
            start = trio.current_time()
            task_status.started()
            ticks = 1
            while True:
                await trio.sleep_until(start + ticks * self.interval)
                await self.push()
                # Like a Go ticker, keep the phase and skip the ticks a long push overran.
                ticks = max(ticks + 1, math.floor((trio.current_time() - start) / self.interval) + 1)
        finally:
            GC_PAUSES.uninstall()
            log.info("STATSD: closing")

    async def push(self) -> None:
        """One push: snapshot, lines, packets, spread over the interval less a second."""
        options = self.broker.options
        address = options.statsd_address
        sock = await _dial(address)
        if sock is None:
            log.error("failed to create UDP socket to statsd(%s)", address)
            return
        with sock:
            log.info("STATSD: pushing stats to %s", address)
            stats = snapshot(self.broker, include_clients=False, include_mem=False)
            memory = memory_stats() if options.statsd_mem_stats else None
            lines, self._last = statsd_lines(options.statsd_prefix, stats.topics or (), memory, self._last,
                                             exclude_ephemeral=options.statsd_exclude_ephemeral)
            self.pushes += 1
            await _spread(sock, pack_lines(lines, packet_size(options.statsd_udp_packet_size)),
                          self.interval - SPREAD_MARGIN, address)


async def _dial(address: str) -> trio.socket.SocketType | None:
    """A UDP socket connected to ``address``, or None when it cannot be resolved or opened."""
    try:
        host, port = split_address(address)
        with trio.fail_after(DIAL_TIMEOUT):
            found = await trio.socket.getaddrinfo(host or None, port, type=socket.SOCK_DGRAM)
        family, kind, proto, _, sockaddr = found[0]
        sock = trio.socket.socket(family, kind, proto)
    except (OSError, ValueError, trio.TooSlowError, IndexError):
        return None
    try:
        await sock.connect(sockaddr)
    except OSError:
        sock.close()
        return None
    return sock


async def _spread(sock: trio.socket.SocketType, packets: list[bytes], window: float, address: str) -> None:
    """Send ``packets`` one by one, evenly over ``window`` seconds (at once when it is not positive).

    Send errors are logged once per push; the remaining packets are still tried.
    """
    start = trio.current_time()
    if window > 0 and not packets:
        await trio.sleep(window)  # nsqd waits out the window with nothing to send, too
        return
    step = window / len(packets) if window > 0 else 0.0
    failed = False
    for index, packet in enumerate(packets):
        try:
            await sock.send(packet)
        except OSError as err:
            if not failed:
                log.warning("STATSD: failed to send to %s: %s", address, err)
                failed = True
        if step:
            await trio.sleep_until(start + (index + 1) * step)
