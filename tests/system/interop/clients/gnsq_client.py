"""gnsq (gevent) against a broker, the way an application uses it.

``python gnsq_client.py publish '{"tcp": "127.0.0.1:4150", "ops": [...]}'``
    a ``gnsq.Producer`` runs the ops (``pub``, ``mpub``, ``dpub``; see pynsq_client.py) in order.

``python gnsq_client.py http '{"http": "127.0.0.1:4151", "ops": [...]}'``
    a ``gnsq.NsqdHTTPClient`` runs ``{"op": "ping"|"info"}``, ``{"op": "create_topic", "topic"}``,
    ``{"op": "create_channel", "topic", "channel"}``, ``{"op": "pub", "topic", "body", ["defer_ms"]}``,
    ``{"op": "mpub", "topic", "bodies", "binary"}``, ``{"op": "stats", ["topic"], ["channel"], ["text"]}``
    and reports each result (``result``) or the exception it raised (``error``).

``python gnsq_client.py consume '{"tcp", "topic", "channels": [...], "expect": N, ...}'``
    one ``gnsq.Consumer`` per entry of ``channels``; same policy (but ``touch_every_ms``), options
    (``lookupd_http`` included) and report as pynsq_client.py (``requeue_with`` ``"raise"`` raises ``NSQRequeueMessage``, ``"method"`` calls
    ``message.requeue``).

gevent is used only through gnsq itself: nothing is monkey-patched.

``publish`` and ``consume`` take ``connection``: keyword arguments for the Producer and every
Consumer (``tls_v1``, ``tls_options``, ``snappy``, ``deflate``, ``deflate_level``, ``auth_secret``).
"""

from __future__ import annotations

import logging
import sys

import gevent
import gnsq
from behaviour import HOLD, REQUEUE, Behaviour
from gevent.event import Event
from gnsq.errors import NSQRequeueMessage
from report import EXIT_TIMEOUT, body_bytes, body_text, emit, emit_message, read_command_line


def connection_options(config: dict) -> dict:
    """``config["connection"]`` as gnsq takes it: the JSON text of ``auth_secret`` as bytes."""
    options = dict(config.get("connection", {}))
    if "auth_secret" in options:
        options["auth_secret"] = options["auth_secret"].encode()
    return options


def publish(config: dict) -> int:
    producer = gnsq.Producer([config["tcp"]], **connection_options(config))
    producer.start()
    with gevent.Timeout(config.get("deadline", 20)):
        for op in config["ops"]:
            topic = op["topic"]
            if op["op"] == "pub":
                response = producer.publish(topic, body_bytes(op["body"]))
            elif op["op"] == "dpub":
                response = producer.publish(topic, body_bytes(op["body"]), defer=op["defer_ms"])
            elif op["op"] == "mpub":
                response = producer.multipublish(topic, [body_bytes(b) for b in op["bodies"]])
            else:
                raise ValueError(f"unknown op {op['op']!r}")
            emit("published", op=op["op"], response=body_text(response))
    producer.close()
    emit("done")
    return 0


def http(config: dict) -> int:
    host, _, port = config["http"].rpartition(":")
    client = gnsq.NsqdHTTPClient(host, int(port), timeout=10.0)
    for op in config["ops"]:
        try:
            result = _http_op(client, op)
        except Exception as error:  # the report carries what the library raised
            emit("http", op=op["op"], error=f"{type(error).__name__}: {error}")
        else:
            emit("http", op=op["op"], result=_jsonable(result))
    emit("done")
    return 0


def _http_op(client: gnsq.NsqdHTTPClient, op: dict):
    kind = op["op"]
    if kind == "ping":
        return client.ping()
    if kind == "info":
        return client.info()
    if kind == "create_topic":
        return client.create_topic(op["topic"])
    if kind == "create_channel":
        return client.create_channel(op["topic"], op["channel"])
    if kind == "pub":
        return client.publish(op["topic"], body_bytes(op["body"]), defer=op.get("defer_ms"))
    if kind == "mpub":
        return client.multipublish(op["topic"], [body_bytes(b) for b in op["bodies"]],
                                   binary=op.get("binary", False))
    if kind == "stats":
        return client.stats(topic=op.get("topic"), channel=op.get("channel"), text=op.get("text", False))
    raise ValueError(f"unknown op {kind!r}")


def _jsonable(value):
    if isinstance(value, bytes):
        return body_text(value)
    return value


class Tally:
    """Counts FINs across consumers; sets ``enough`` once ``expect`` were sent."""

    def __init__(self, expect: int):
        self.expect = expect
        self.finished = 0
        self.enough = Event()

    def on_finish(self, consumer, message_id) -> None:
        self.finished += 1
        if self.finished >= self.expect:
            self.enough.set()


def make_consumer(index: int, channel: str, behaviour: Behaviour, tally: Tally, config: dict,
                  held: list) -> gnsq.Consumer:
    requeue_with = config.get("requeue_with", "raise")

    def handler(consumer, message):
        action = behaviour.action(message.attempts)
        emit_message(index, channel, message.id, message.body, message.attempts, message.timestamp, action)
        if action == HOLD:
            message.enable_async()
            held.append(message)
        elif action == REQUEUE:
            if requeue_with == "method":
                message.requeue(behaviour.requeue_delay_ms, backoff=False)
            else:
                raise NSQRequeueMessage()
        elif behaviour.finish_after_ms:
            message.enable_async()
            gevent.spawn_later(behaviour.finish_after_ms / 1000, message.finish)

    consumer = gnsq.Consumer(
        config["topic"],
        channel,
        [config["tcp"]] if "tcp" in config else [],
        lookupd_http_addresses=config.get("lookupd_http", []),
        lookupd_poll_interval=config.get("lookupd_poll_interval", 60),
        message_handler=handler,
        max_in_flight=config.get("max_in_flight", 1),
        max_tries=config.get("max_tries", 5),
        requeue_delay=behaviour.requeue_delay_ms,
        # Keep the client's own backoff short: the tests observe the broker, not the pauses.
        max_backoff_duration=config.get("max_backoff_duration", 0.1),
        **connection_options(config),
    )
    subscribed = {"done": False}

    def on_response(consumer, response):
        # IDENTIFY's answer is JSON; the first plain OK answers SUB.
        if response == b"OK" and not subscribed["done"]:
            subscribed["done"] = True
            emit("subscribed", reader=index, channel=channel)

    def on_error(consumer, error):
        emit("error", reader=index, error=f"{type(error).__name__}: {error}")

    def on_giving_up(consumer, message):
        emit("giving_up", reader=index, id=message.id.decode("ascii"), attempts=message.attempts)

    consumer.on_response.connect(on_response, weak=False)
    consumer.on_error.connect(on_error, weak=False)
    consumer.on_giving_up.connect(on_giving_up, weak=False)
    consumer.on_finish.connect(tally.on_finish, weak=False)
    return consumer


def consume(config: dict) -> int:
    behaviour = Behaviour.from_config(config)
    tally = Tally(config["expect"])
    held: list = []
    consumers = [
        make_consumer(index, channel, behaviour, tally, config, held)
        for index, channel in enumerate(config["channels"])
    ]
    for consumer in consumers:
        consumer.start(block=False)
    if not tally.enough.wait(config.get("deadline", 20)):
        emit("timeout", finished=tally.finished)
        return EXIT_TIMEOUT
    gevent.sleep(config.get("linger", 0))
    for consumer in consumers:
        consumer.close()
    emit("done", finished=tally.finished)
    return 0


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    command, config = read_command_line(argv)
    commands = {"publish": publish, "http": http, "consume": consume}
    if command not in commands:
        raise SystemExit(f"unknown command {command!r}")
    return commands[command](config)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
