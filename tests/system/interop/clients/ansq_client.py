"""ansq (asyncio) against a broker, the way an application uses it.

``python ansq_client.py publish '{"tcp": "127.0.0.1:4150", "ops": [...]}'``
    ``ansq.create_writer`` runs the ops (``pub``, ``mpub``, ``dpub``; see pynsq_client.py) in order
    and reports each response (``OK``, or the error frame's text).

``python ansq_client.py consume '{"tcp", "topic", "channels": [...], "expect": N, ...}'``
    one ``ansq.create_reader`` per entry of ``channels``; messages are taken from
    ``reader.messages()`` and answered with ``message.fin()`` / ``message.req(delay_ms)`` by the
    policy in behaviour.py (``hold_below``, ``requeue_below``, ``requeue_delay_ms``). ansq keeps
    RDY at 1 per connection. Report as pynsq_client.py.
"""

from __future__ import annotations

import asyncio
import logging
import sys

import ansq
from ansq import ConnectionOptions
from behaviour import HOLD, REQUEUE, Behaviour
from report import body_bytes, emit, emit_message, read_command_line
from tally import Tally, finish_when_enough


async def publish(config: dict) -> int:
    writer = await ansq.create_writer(
        nsqd_tcp_addresses=[config["tcp"]],
        connection_options=ConnectionOptions(auto_reconnect=False),
    )
    for op in config["ops"]:
        topic = op["topic"]
        if op["op"] == "pub":
            response = await writer.pub(topic, body_bytes(op["body"]))
        elif op["op"] == "dpub":
            response = await writer.dpub(topic, body_bytes(op["body"]), op["defer_ms"])
        elif op["op"] == "mpub":
            # ansq sends a one-element MPUB without the count field, so tests pass two or more.
            response = await writer.mpub(topic, *[body_bytes(b) for b in op["bodies"]])
        else:
            raise ValueError(f"unknown op {op['op']!r}")
        emit("published", op=op["op"], response="OK" if response.is_ok else response.text)
    await writer.close()
    emit("done")
    return 0


async def read(index: int, reader, behaviour: Behaviour, tally: Tally, held: list) -> None:
    async for message in reader.messages():
        action = behaviour.action(message.attempts)
        emit_message(index, reader.channel, message.id, message.body, message.attempts,
                     message.timestamp, action)
        if action == HOLD:
            held.append(message)
        elif action == REQUEUE:
            await message.req(behaviour.requeue_delay_ms)
        else:
            await message.fin()
            tally.on_finish()


async def consume(config: dict) -> int:
    behaviour = Behaviour.from_config(config)
    tally = Tally(config["expect"])
    held: list = []

    def on_exception(error):
        emit("error", error=f"{type(error).__name__}: {error}")

    readers = []
    for index, channel in enumerate(config["channels"]):
        reader = await ansq.create_reader(
            topic=config["topic"],
            channel=channel,
            nsqd_tcp_addresses=[config["tcp"]],
            connection_options=ConnectionOptions(auto_reconnect=False, on_exception=on_exception),
        )
        # create_reader returns once SUB was answered with OK and RDY 1 was sent.
        emit("subscribed", reader=index, channel=channel)
        readers.append(reader)
    tasks = [asyncio.create_task(read(i, r, behaviour, tally, held)) for i, r in enumerate(readers)]

    async def close() -> None:
        for task in tasks:
            task.cancel()
        for reader in readers:
            await reader.close()

    return await finish_when_enough(tally, config, close)


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    command, config = read_command_line(argv)
    if command == "publish":
        return asyncio.run(publish(config))
    if command == "consume":
        return asyncio.run(consume(config))
    raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
