"""Crash matrix: ``pynsqd --durable`` killed with SIGKILL round after round, every way it is used.

Each cell of {``--mem-queue-size=0``, default} x {ordered consumer, random
consumer} x {PUB, MPUB, DPUB} gets a data directory of its own and runs
``--rounds`` rounds: a real broker process starts on it, two publishers (the
cell's command) and two consumers work against it for a random 0.3-1.5 s, and
the broker is killed with SIGKILL. A last run drains the channel. Consumers:

- ordered: keeps a full RDY window (200) and FINs every message in delivery order;
- random: RDY 50; per message FIN (70 %), REQ 0 (10 %), REQ with a delay of
  50-800 ms (10 %), or no answer, so the broker times it out after ``--msg-timeout=1s`` (10 %).

What it counts, per cell (from what the clients saw, nothing from the broker's insides):

- ``lost``: messages that got ``OK`` and were never FIN'd, even after the drain: must be 0;
- ``fin_undone``: deliveries of a message after a FIN for it was sent in an earlier run
  (the crash came before that FIN was on disk);
- ``copies``: deliveries of a message after a FIN for it was sent earlier in the same run
  (two copies of one message): must be 0;
- ``early``: DPUB'd messages delivered before their due time: must be 0;
- ``redelivered``: deliveries that follow a REQ, a timeout or a crash while in flight (expected).

The random choices are seeded (``--seed``), so a run can be replayed. Exit status 1
when anything was lost, copied twice or delivered early.

Usage (from the repository root)::

    python -m tests.bench.crash_matrix --rounds 100             # the full run, about 30 minutes
    python -m tests.bench.crash_matrix --rounds 3 --json        # what CI runs
    python -m tests.bench.crash_matrix --cells 'default:random:DPUB' --rounds 20 --seed 7
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import trio

from broker.protocol import (
    encode_dpub,
    encode_mpub,
    encode_pub,
    encode_rdy,
    encode_sub,
)
from tests.support import crash_clients
from tests.support.draining import drain
from tests.support.http_client import request
from tests.support.ledger import Ledger
from tests.support.processes import BrokerProcess
from tests.support.v2client import connect

MEMORY = {"mem0": ("--mem-queue-size=0",), "default": ()}
CONSUMERS = ("ordered", "random")
COMMANDS = ("PUB", "MPUB", "DPUB")
TOPIC, CHANNEL = "crash", "c"
FLAGS = ("--durable", "--msg-timeout=1s")


@dataclass
class CellResult:
    """What one cell's clients saw."""

    cell: str
    rounds: int
    acknowledged: int = 0
    delivered: int = 0
    deliveries: int = 0
    lost: int = 0
    fin_undone: int = 0
    copies: int = 0
    early: int = 0
    redelivered: int = 0
    seconds: float = 0.0
    examples: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.copies or self.early)


def _publishes(command: str, name: str, ledger: Ledger, rng: random.Random):
    """The cell's command: MPUB of 2-49, DPUB by 20-1500 ms, or PUB; the bodies are named after ``name``."""
    def next_publish(seq: int) -> tuple[bytes, list[bytes]]:
        if command == "MPUB":
            bodies = [f"{name}-{seq + i}".encode() for i in range(rng.randrange(2, 50))]
            return encode_mpub(TOPIC, bodies), bodies
        if command == "DPUB":
            defer_ms = rng.randrange(20, 1500)
            body = f"{name}-{seq}-d{defer_ms}".encode()
            ledger.defer(body, defer_ms)
            return encode_dpub(TOPIC, defer_ms, body), [body]
        body = f"{name}-{seq}".encode()
        return encode_pub(TOPIC, body), [body]

    return next_publish


def _answers(kind: str, rng: random.Random):
    """ordered: FIN every message; random: FIN (70 %), REQ 0 (10 %), REQ 50-800 ms (10 %) or no answer."""
    def answer() -> tuple[str, int]:
        roll = rng.random() if kind == "random" else 0.0
        if roll < 0.7:
            return "FIN", 0
        if roll < 0.8:
            return "REQ", 0
        if roll < 0.9:
            return "REQ", rng.randrange(50, 800)
        return "timeout", 0

    return answer


async def _stats(proc: BrokerProcess) -> dict | None:
    reply = await request(proc.http, "GET", f"/stats?format=json&topic={TOPIC}&channel={CHANNEL}")
    return reply.json() if reply.status == 200 else None


def _drained(doc: dict | None) -> bool:
    if not doc or not doc["topics"]:
        return False
    topic = doc["topics"][0]
    if topic["depth"] or not topic["channels"]:
        return False
    channel = topic["channels"][0]
    return (channel["depth"], channel["in_flight_count"], channel["deferred_count"]) == (0, 0, 0)


async def _round(proc: BrokerProcess, ledger: Ledger, command: str, consumer: str, rng: random.Random) -> None:
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        for _ in range(2):
            nursery.start_soon(crash_clients.consumer, proc.tcp, ledger, stop, TOPIC, CHANNEL,
                               50 if consumer == "random" else 200, _answers(consumer, random.Random(rng.random())))
        for i in range(2):
            next_publish = _publishes(command, f"r{ledger.run}p{i}", ledger, random.Random(rng.random()))
            nursery.start_soon(crash_clients.publisher, proc.tcp, ledger, stop, next_publish)
        await trio.sleep(rng.uniform(0.3, 1.5))
        proc.kill()
        stop.set()


async def _drain(proc: BrokerProcess, ledger: Ledger, stall: float) -> None:
    """FIN everything until every acknowledged message is finished and the channel holds nothing.

    Gives up once ``stall`` seconds pass without a delivery, so that what is missing is reported.
    """
    bodies: dict[bytes, bytes] = {}  # message id -> body, of the messages the drain was given
    quiet_since = trio.current_time()

    def record(client, msg) -> None:
        nonlocal quiet_since
        quiet_since = trio.current_time()
        bodies[msg.id] = msg.body
        ledger.delivered(msg.body)
        ledger.answered(msg.body, "FIN")

    def refused(frame) -> None:
        if not frame.data.startswith(b"E_FIN_FAILED FIN "):
            raise AssertionError(f"unexpected error {frame}")
        ledger.fin_failed(bodies[frame.data.split()[2]])

    async def done() -> bool:
        if trio.current_time() - quiet_since >= stall:
            return True
        return ledger.acked <= ledger.fin_runs.keys() and _drained(await _stats(proc))

    client = await connect(proc.tcp, timeout=10)
    await client.send(encode_sub(TOPIC, CHANNEL))
    await client.expect_response(b"OK")
    await client.send(encode_rdy(2500))
    try:
        await drain(client, done, on_message=record, on_error=refused, poll=0.2)
    finally:
        await client.aclose()


async def run_cell(cell: str, rounds: int, seed: int, workdir: Path) -> CellResult:
    """Run one cell (``memory:consumer:command``) and count what its clients saw."""
    memory, consumer, command = cell.split(":")
    rng = random.Random(f"{seed}:{cell}")
    ledger = Ledger()
    data = workdir / cell.replace(":", "-") / "data"
    flags = (*FLAGS, *MEMORY[memory])
    started = time.monotonic()
    proc: BrokerProcess | None = None
    try:
        for number in range(rounds):
            ledger.run = number
            proc = BrokerProcess(data, *flags).start()
            await _round(proc, ledger, command, consumer, rng)
        ledger.run = rounds
        proc = BrokerProcess(data, *flags).start()
        await _drain(proc, ledger, stall=30)
        proc.terminate()
    finally:
        if proc is not None:
            proc.kill()
    missing = sorted(ledger.acked - ledger.finished)
    copies = ledger.copies()
    result = CellResult(cell=cell, rounds=rounds, acknowledged=len(ledger.acked), delivered=len(ledger.last),
                        deliveries=ledger.delivery_count, lost=len(missing), fin_undone=ledger.fin_undone,
                        copies=len(copies), early=len(ledger.early), redelivered=ledger.redelivered,
                        seconds=round(time.monotonic() - started, 1))
    result.examples = [f"{body!r} delivered again in run {run} after its FIN in that run" for body, run in copies[:5]]
    result.examples += ledger.early[:5] + [f"lost {body!r}" for body in missing[:5]]
    return result


def all_cells() -> list[str]:
    return [":".join(parts) for parts in itertools.product(MEMORY, CONSUMERS, COMMANDS)]


def _table(results: list[CellResult]) -> str:
    head = ["cell", "rounds", "acknowledged", "lost", "copies", "fin_undone", "redelivered", "early", "seconds"]
    rows = [[str(getattr(r, name)) for name in head] for r in results]
    total = CellResult(cell="total", rounds=sum(r.rounds for r in results))
    for name in head[2:]:
        setattr(total, name, round(sum(getattr(r, name) for r in results), 1))
    rows.append([str(getattr(total, name)) for name in head])
    widths = [max(len(row[i]) for row in [head, *rows]) for i in range(len(head))]
    return "\n".join(" | ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in [head, *rows])


async def main_async(args: argparse.Namespace) -> list[CellResult]:
    cells = args.cells.split(",") if args.cells else all_cells()
    results = []
    with tempfile.TemporaryDirectory(prefix="crash-matrix-") as tmp:
        for cell in cells:
            result = await run_cell(cell, args.rounds, args.seed, Path(tmp))
            results.append(result)
            if not args.json:
                print(f"{cell}: {result.acknowledged} acknowledged, {result.lost} lost, {result.copies} copies, "
                      f"{result.fin_undone} FINs undone, {result.early} early ({result.seconds} s)",
                      file=sys.stderr, flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=100, help="SIGKILL rounds per cell (default 100)")
    parser.add_argument("--seed", type=int, default=20261124, help="seed of every random choice")
    parser.add_argument("--cells", default="", help="comma-separated memory:consumer:command cells "
                        f"(default all {len(all_cells())}: memory in {list(MEMORY)}, consumer in "
                        f"{list(CONSUMERS)}, command in {list(COMMANDS)})")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    for cell in args.cells.split(",") if args.cells else []:
        if cell not in all_cells():
            parser.error(f"unknown cell {cell!r}")
    results = trio.run(main_async, args)
    if args.json:
        print(json.dumps([asdict(r) | {"ok": r.ok} for r in results], indent=1))
    else:
        print(f"seed {args.seed}, {args.rounds} rounds per cell")
        print(_table(results))
        for r in results:
            for example in r.examples:
                print(f"  {r.cell}: {example}")
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
