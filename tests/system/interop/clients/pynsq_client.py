"""pynsq (Tornado) against a broker, the way an application uses it.

``python pynsq_client.py publish '{"tcp": "127.0.0.1:4150", "ops": [...]}'``
    an ``nsq.Writer`` runs the ops in order and reports each response; an op is
    ``{"op": "pub", "topic", "body"}``, ``{"op": "mpub", "topic", "bodies"}`` or
    ``{"op": "dpub", "topic", "defer_ms", "body"}``.

``python pynsq_client.py consume '{"tcp", "topic", "channels": [...], "expect": N, ...}'``
    one ``nsq.Reader`` per entry of ``channels`` (repeat a name for readers sharing a channel)
    handles deliveries by the policy in behaviour.py until ``expect`` messages are finished, keeps
    going for ``linger`` seconds, then reports ``done``. Instead of ``tcp``, ``lookupd_http`` lists
    nsqlookupd HTTP addresses the readers discover brokers through (polled every
    ``lookupd_poll_interval`` seconds). Optional: ``max_in_flight``,
    ``max_tries``, ``batch`` (answer asynchronously, a batch at a time, when the reader is starved),
    ``requeue_with`` (``"return"``: handler returns False; ``"method"``: ``message.requeue``),
    ``deadline`` seconds.

Both commands take ``connection``: keyword arguments for every ``nsq.Writer``/``nsq.Reader``
(``tls_v1``, ``tls_options``, ``snappy``, ``deflate``, ``deflate_level``, ``auth_secret``).

Report lines: ``subscribed``, ``message``, ``batch``, ``touch``, ``giving_up``, ``error``,
``published``, ``done``; ``timeout`` (exit status 3) when the deadline passes first.
"""

from __future__ import annotations

import asyncio
import logging
import sys

import nsq
from behaviour import HOLD, REQUEUE, Behaviour
from report import body_bytes, emit, emit_message, read_command_line
from tally import Tally, finish_when_enough

# After the last delivery of a burst, how long a batching handler waits for more before it
# answers what it holds.
BATCH_IDLE_S = 0.05


async def publish(config: dict) -> None:
    writer = nsq.Writer([config["tcp"]], **config.get("connection", {}))
    # nsq.Writer has no "connected" callback; applications retry until a connection is open.
    while not any(conn.connected() for conn in writer.conns.values()):
        await asyncio.sleep(0.01)
    for op in config["ops"]:
        response = await _send(writer, op)
        emit("published", op=op["op"], response=response)
    for conn in list(writer.conns.values()):
        conn.close()


async def _send(writer: nsq.Writer, op: dict) -> str:
    answered = asyncio.get_running_loop().create_future()

    def callback(conn, data):
        if not answered.done():
            answered.set_result(data)

    if op["op"] == "pub":
        writer.pub(op["topic"], body_bytes(op["body"]), callback=callback)
    elif op["op"] == "mpub":
        writer.mpub(op["topic"], [body_bytes(b) for b in op["bodies"]], callback=callback)
    elif op["op"] == "dpub":
        writer.dpub(op["topic"], op["defer_ms"], body_bytes(op["body"]), callback=callback)
    else:
        raise ValueError(f"unknown op {op['op']!r}")
    data = await answered
    if isinstance(data, bytes):
        return data.decode("latin-1")
    return f"error: {data!r}"


class RecordingReader(nsq.Reader):
    """An ``nsq.Reader`` that reports what it sees and answers by the configured policy."""

    def __init__(self, index: int, behaviour: Behaviour, tally: Tally, config: dict, **kwargs):
        self.index = index
        self.behaviour = behaviour
        self.tally = tally
        self.batch = bool(config.get("batch"))
        self.requeue_with = config.get("requeue_with", "return")
        self.held: list[nsq.Message] = []
        self.pending: list[nsq.Message] = []
        self.flush_timer = None
        self.closing = False
        super().__init__(message_handler=self.handle, **kwargs)

    def connect_to_nsqd(self, host, port):
        conn = super().connect_to_nsqd(host, port)
        if conn is not None:
            self._watch(conn)
        return conn

    def _watch(self, conn) -> None:
        # After IDENTIFY completes the Reader sends SUB; the next plain OK answers it.
        state = {"ready": False, "subscribed": False}

        def on_ready(conn, **kwargs):
            state["ready"] = True

        def on_response(conn, data, **kwargs):
            if state["ready"] and not state["subscribed"] and data == b"OK":
                state["subscribed"] = True
                emit("subscribed", reader=self.index, channel=self.channel)

        def on_error(conn, error, **kwargs):
            # Closing the reader fails its pending read; that is not the broker's doing.
            if not self.closing:
                emit("error", reader=self.index, error=str(error))

        conn.on("ready", on_ready)
        conn.on("response", on_response)
        conn.on("error", on_error)

    def handle(self, message: nsq.Message):
        message.on("finish", self.tally.on_finish)
        action = self.behaviour.action(message.attempts)
        emit_message(self.index, self.channel, message.id, message.body, message.attempts,
                     message.timestamp, action)
        if action == HOLD:
            message.enable_async()
            self.held.append(message)
            return None
        if action == REQUEUE:
            if self.requeue_with == "method":
                message.requeue(backoff=False, delay=self.behaviour.requeue_delay_ms // 1000)
                return None
            return False
        if self.batch:
            message.enable_async()
            self.pending.append(message)
            if self.is_starved():
                self.flush()
            else:
                self._arm_flush_timer()
            return None
        if self.behaviour.finish_after_ms:
            message.enable_async()
            self.io_loop.call_later(self.behaviour.finish_after_ms / 1000, message.finish)
            if self.behaviour.touch_every_ms:
                self._touch_until_answered(message)
            return None
        return True

    def _touch_until_answered(self, message: nsq.Message) -> None:
        def touch():
            if not message.has_responded():
                message.touch()
                emit("touch", reader=self.index, id=message.id.decode("ascii"))
                self.io_loop.call_later(self.behaviour.touch_every_ms / 1000, touch)

        self.io_loop.call_later(self.behaviour.touch_every_ms / 1000, touch)

    def close(self) -> None:
        self.closing = True
        super().close()

    def _arm_flush_timer(self) -> None:
        if self.flush_timer is not None:
            self.io_loop.remove_timeout(self.flush_timer)
        self.flush_timer = self.io_loop.call_later(BATCH_IDLE_S, self.flush)

    def flush(self) -> None:
        if self.flush_timer is not None:
            self.io_loop.remove_timeout(self.flush_timer)
            self.flush_timer = None
        if not self.pending:
            return
        emit("batch", reader=self.index, size=len(self.pending))
        batch, self.pending = self.pending, []
        for message in batch:
            message.finish()

    def giving_up(self, message: nsq.Message) -> None:
        # The Reader finishes the message right after this hook, without calling the handler.
        message.on("finish", self.tally.on_finish)
        emit("giving_up", reader=self.index, id=message.id.decode("ascii"), attempts=message.attempts)


async def consume(config: dict) -> int:
    behaviour = Behaviour.from_config(config)
    tally = Tally(config["expect"])
    readers = [
        RecordingReader(
            index,
            behaviour,
            tally,
            config,
            topic=config["topic"],
            channel=channel,
            nsqd_tcp_addresses=[config["tcp"]] if "tcp" in config else None,
            lookupd_http_addresses=config.get("lookupd_http"),
            lookupd_poll_interval=config.get("lookupd_poll_interval", 60),
            max_in_flight=config.get("max_in_flight", 1),
            max_tries=config.get("max_tries", 5),
            # Keep the client's own backoff short: the tests observe the broker, not the pauses.
            max_backoff_duration=config.get("max_backoff_duration", 0.1),
            requeue_delay=0,
            **config.get("connection", {}),
        )
        for index, channel in enumerate(config["channels"])
    ]

    async def close() -> None:
        for reader in readers:
            reader.close()

    return await finish_when_enough(tally, config, close)


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    command, config = read_command_line(argv)
    if command == "publish":
        asyncio.run(publish(config))
        emit("done")
        return 0
    if command == "consume":
        return asyncio.run(consume(config))
    raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
