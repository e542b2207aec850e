"""``bench writer``: publish pre-encoded PUB or MPUB commands as fast as the server acks them.

As nsq's bench_writer, every connection sends one command, waits for its OK and
sends the next (``--pipeline`` keeps more in flight). The command is encoded
once: every batch carries the same zero-filled bodies, so the timed loop only
writes bytes it already has and counts OK frames.
"""

from __future__ import annotations

import functools
import selectors
import time

from broker.client import FramePump
from broker.protocol import FRAME_TYPE_ERROR, FRAME_TYPE_RESPONSE, OK_FRAME, encode_mpub, encode_pub

from .arguments import WriterConfig
from .opening import BenchConnection, ServerError
from .pool import Scoreboard, WorkerReport, cpu_seconds, run_pool
from .report import BenchResult, build_result

__all__ = ["WriterWorker", "run_writer", "split_quotas"]

_RECV_SIZE = 65536
_SELECT_TIMEOUT = 0.05


def split_quotas(total: int, parts: int) -> list[int]:
    """``total`` divided into ``parts`` shares that differ by at most one."""
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


class _Publisher:
    """One connection's state in the timed loop."""

    __slots__ = ("pump", "sock", "remaining", "outstanding")

    def __init__(self, conn: BenchConnection, remaining: int | None):
        self.pump: FramePump = conn.pump
        self.sock = conn.take_over()
        self.remaining = remaining  # commands still to send, None: until stopped
        self.outstanding = 0

    def count_oks(self, data: bytes) -> int:
        """OK frames in ``data`` (the pump answers heartbeats); raises ServerError on any other frame."""
        frames = self.pump.feed(data)
        for frame_type, payload in frames:
            if frame_type == FRAME_TYPE_ERROR:
                raise ServerError.from_frame(self.pump.address, payload)
            if frame_type != FRAME_TYPE_RESPONSE:
                raise ServerError(self.pump.address, "E_UNEXPECTED",
                                  f"unexpected frame type {frame_type} on a publishing connection")
        return len(frames)


class WriterWorker:
    """One process's share of the writer's connections.

    ``quotas`` has one entry per connection: the number of commands it sends, or
    None to send until the end of the run.
    """

    def __init__(self, config: WriterConfig, quotas: list[int | None]):
        self._config = config
        self._quotas = quotas
        self._conns: list[BenchConnection] = []
        body = bytes(config.size)
        if config.mpub:
            self._command = encode_mpub(config.topic, [body] * config.batch_size)
            self._per_command = config.batch_size
        else:
            self._command = encode_pub(config.topic, body)
            self._per_command = 1

    def connect(self) -> None:
        """Open and identify every connection of this worker (blocking)."""
        c = self._config
        for _ in self._quotas:
            self._conns.append(BenchConnection.open(c.host, c.port, "bench_writer", c.identify))

    def close(self) -> None:
        """Close every connection."""
        for conn in self._conns:
            conn.close()

    def run(self, start: float, end: float | None, board: Scoreboard, slot: int) -> WorkerReport:
        """Publish until ``end``, the quotas are sent or the stop flag is raised."""
        cpu0 = cpu_seconds()
        began = time.monotonic()
        command = self._command
        per_command = self._per_command
        pipeline = self._config.pipeline
        ok_run = OK_FRAME * pipeline
        ok_len = len(OK_FRAME)
        selector = selectors.DefaultSelector()
        active = 0
        for conn, quota in zip(self._conns, self._quotas):
            pub = _Publisher(conn, quota)
            first = pipeline if quota is None else min(pipeline, quota)
            if first:
                pub.sock.sendall(command * first)
                pub.outstanding = first
                if quota is not None:
                    pub.remaining = quota - first
                selector.register(pub.sock, selectors.EVENT_READ, pub)
                active += 1
        acked = 0
        stopping = False
        select = selector.select
        monotonic = time.monotonic
        while active:
            events = select(_SELECT_TIMEOUT)
            now = monotonic()
            for key, _ in events:
                pub = key.data
                data = pub.sock.recv(_RECV_SIZE)
                if not data:
                    raise ServerError(pub.pump.address, "E_CONNECTION", "connection closed by the server")
                n = len(data)
                if not pub.pump.buffered and n % ok_len == 0 and ok_run.startswith(data):
                    oks = n // ok_len
                else:
                    oks = pub.count_oks(data)
                if not oks:
                    continue
                pub.outstanding -= oks
                acked += oks
                more = 0 if stopping else oks
                if pub.remaining is not None:
                    more = min(more, pub.remaining)
                    pub.remaining -= more
                if more:
                    pub.sock.sendall(command if more == 1 else command * more)
                    pub.outstanding += more
                elif not pub.outstanding:
                    selector.unregister(pub.sock)
                    active -= 1
            board.set(slot, acked * per_command)
            if not stopping and ((end is not None and now >= end) or board.stopped):
                stopping = True
                for key in list(selector.get_map().values()):
                    if not key.data.outstanding:
                        selector.unregister(key.fileobj)
                        active -= 1
        selector.close()
        # the loop ends with the last outstanding OK (or the end of a quota)
        finished = monotonic()
        cpu1 = cpu_seconds()
        messages = acked * per_command
        return WorkerReport(
            messages=messages,
            body_bytes=messages * self._config.size,
            started=began,
            finished=finished,
            cpu_user=cpu1[0] - cpu0[0],
            cpu_system=cpu1[1] - cpu0[1],
        )


def run_writer(config: WriterConfig) -> BenchResult:
    """Run the writer benchmark; raises BenchFailed or OSError."""
    quotas: list[int | None]
    if config.count is not None:
        per_command = config.batch_size if config.mpub else 1
        commands = -(-config.count // per_command)
        quotas = list(split_quotas(commands, config.connections))
    else:
        quotas = [None] * config.connections
    shares = split_quotas(config.connections, config.processes)
    factories, pos = [], 0
    for share in shares:
        factories.append(functools.partial(WriterWorker, config, quotas[pos : pos + share]))
        pos += share
    outcome = run_pool(factories, label="writer", runfor=config.runfor, deadline=config.deadline,
                       progress=config.progress)
    return build_result("writer", config, outcome)
