"""A stand-in for an nsqd on a plain socket in a thread of its own, for the Spark connector's
tests without Spark or a broker.

:class:`ThreadedPeer` accepts connections on 127.0.0.1, one after another, and hands each to
its subclass's ``converse``. :class:`FakeBroker` reads the V2 commands a publisher sends, as a
broker offering keyed publishes and priorities would (``publish_keys``, ``priorities`` in
IDENTIFY's answer) or as nsqd, which has neither, does. It keeps the keys each topic stored and
answers ``OK``, ``DUPLICATE`` or ``DUPLICATE <n>``, so the publisher's counts, its refusal of
nsqd and its resend after a lost connection can be checked byte for byte.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
from dataclasses import dataclass, field

from broker.protocol import MAGIC_V2, encode_response
from broker.protocol.keys import split_key
from pyspark_nsq.options import Address
from pyspark_nsq.publisher import Publisher

__all__ = ["Command", "FakeBroker", "ThreadedPeer", "publish", "read_sized"]

_SIZE = struct.Struct(">I")


class ThreadedPeer:
    """Serves connections one after another on 127.0.0.1 in a thread, from :meth:`start_serving`
    until :meth:`close`; each conversation is :meth:`converse`'s (a connection error ends it)."""

    address: Address
    connections: int = 0

    def start_serving(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = Address("127.0.0.1", self._listener.getsockname()[1])
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def close(self) -> None:
        # a shut-down listening socket wakes the accept() waiting in the thread (close alone does not)
        self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self._thread.join(10)
        assert not self._thread.is_alive()

    def converse(self, conn: socket.socket, reader) -> None:
        """One connection: ``reader`` reads what the client sends, ``conn`` takes the answers."""
        raise NotImplementedError

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed
            self.connections += 1
            with conn, conn.makefile("rb") as reader:
                try:
                    self.converse(conn, reader)
                except (ConnectionError, EOFError):
                    pass


@dataclass
class Command:
    """One publish the fake received: its name, topic, IDENTIFY of its connection, messages."""

    name: bytes
    topic: str
    raw: list[bytes]  # the messages as sent (with their key prefix on a keyed connection)


@dataclass
class FakeBroker(ThreadedPeer):
    """Serves connections one after another on 127.0.0.1 until closed.

    ``offers_keys``: answer IDENTIFY with ``publish_keys`` (a pynsqd) or without (nsqd);
    ``offers_priorities`` the same for ``priorities``, with ``default_priority``.
    ``drop_after``: close the connection, unanswered, right after storing that many
    commands (once), as a broker whose connection is lost does.
    """

    offers_keys: bool = True
    offers_priorities: bool = True
    default_priority: int = 1 << 31
    drop_after: int | None = None
    identifies: list[dict] = field(default_factory=list)
    commands: list[Command] = field(default_factory=list)
    stored: dict[str, list[tuple[bytes, bytes]]] = field(default_factory=dict)  # topic: (key, body)

    def __post_init__(self):
        self.start_serving()

    def bodies(self, topic: str) -> list[bytes]:
        return [body for _, body in self.stored.get(topic, [])]

    def converse(self, conn: socket.socket, reader) -> None:
        assert reader.read(4) == MAGIC_V2
        keyed = False
        while line := reader.readline():
            name, *params = line.rstrip(b"\n").split(b" ")
            if name == b"IDENTIFY":
                asked = json.loads(read_sized(reader))
                self.identifies.append(asked)
                keyed = self.offers_keys and asked.get("publish_keys") is True
                answer = {"max_msg_timeout": 900000, **({"publish_keys": True, "dedup_window": 600000}
                                                        if keyed else {})}
                if self.offers_priorities and asked.get("priorities") is True:
                    answer.update(priorities=True, default_priority=self.default_priority)
                conn.sendall(encode_response(json.dumps(answer).encode()))
                continue
            if name == b"MPUB":
                body = read_sized(reader)
                (count,) = _SIZE.unpack_from(body)
                raw, offset = [], 4
                for _ in range(count):
                    (size,) = _SIZE.unpack_from(body, offset)
                    raw.append(body[offset + 4:offset + 4 + size])
                    offset += 4 + size
            elif name in (b"PUB", b"DPUB"):
                raw = [read_sized(reader)]
            else:
                raise AssertionError(f"unexpected command {line!r}")
            topic = params[0].decode()
            self.commands.append(Command(name, topic, raw))
            duplicates = sum(self._store(topic, message, keyed) for message in raw)
            if self.drop_after == len(self.commands):
                self.drop_after = None
                return
            if not keyed or not duplicates:
                conn.sendall(encode_response(b"OK"))
            else:
                conn.sendall(encode_response(b"DUPLICATE" if name != b"MPUB" else b"DUPLICATE %d" % duplicates))

    def _store(self, topic: str, message: bytes, keyed: bool) -> bool:
        """Store ``message`` unless its key is stored already; True for a duplicate."""
        key, body = split_key(message) if keyed else (b"", message)
        stored = self.stored.setdefault(topic, [])
        if key and any(key == seen for seen, _ in stored):
            return True
        stored.append((key, body))
        return False


def read_sized(reader) -> bytes:
    header = reader.read(4)
    if len(header) < 4:
        raise EOFError
    return reader.read(_SIZE.unpack(header)[0])


def publish(addresses, topic, bodies, keys=None, priorities=None, *, keyed=False, prioritised=False,
            batch_size=100, defer_ms=0) -> Publisher:
    """Publish ``bodies`` with the connector's :class:`Publisher` (keyed when ``keys`` or ``keyed``
    is given, with ``priorities`` when ``prioritised``) and wait for the answers; the publisher."""
    publisher = Publisher(addresses, batch_size=batch_size, defer_ms=defer_ms, keyed=keyed or keys is not None,
                          prioritised=prioritised)
    try:
        publisher.publish(topic, bodies, keys, priorities)
        publisher.flush()
    finally:
        publisher.close()
    return publisher
