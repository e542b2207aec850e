"""Publish random JSON events for windowed_counts.py through nsqd's HTTP API (/mpub).

    python spark/examples/publish_events.py --http 127.0.0.1:4151 --rate 200 --seconds 60

Each second it publishes ``--rate`` events stamped with the current time, and a
few deliberately late ones (up to ``--late`` seconds old) to exercise the
watermark. Uses only the standard library.
"""

from __future__ import annotations

import argparse
import json
import random
import time
import urllib.request
from datetime import UTC, datetime, timedelta

KINDS = ("click", "view", "purchase")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--http", default="127.0.0.1:4151", help="nsqd HTTP address")
    parser.add_argument("--topic", default="events")
    parser.add_argument("--rate", type=int, default=100, help="events per second")
    parser.add_argument("--seconds", type=int, default=30, help="how long to publish")
    parser.add_argument("--late", type=float, default=3.0, help="maximum lateness, seconds")
    parser.add_argument("--seed", type=int, default=None)
    return parser.parse_args(argv)


def event(rng: random.Random, now: datetime, late: float) -> bytes:
    """One JSON event; one in twenty is up to ``late`` seconds old."""
    if rng.random() < 0.05:
        now -= timedelta(seconds=rng.uniform(0, late))
    return json.dumps({
        "time": now.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "kind": rng.choice(KINDS),
        "amount": round(rng.uniform(1, 100), 2),
    }).encode()


def publish(http: str, topic: str, bodies: list[bytes]) -> None:
    """POST newline-separated bodies to /mpub (JSON bodies contain no newline)."""
    request = urllib.request.Request(f"http://{http}/mpub?topic={topic}", data=b"\n".join(bodies),
                                     method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        response.read()


def main(argv=None) -> None:
    args = parse_args(argv)
    rng = random.Random(args.seed)
    total = 0
    for _ in range(args.seconds):
        started = time.monotonic()
        now = datetime.now(UTC)
        publish(args.http, args.topic, [event(rng, now, args.late) for _ in range(args.rate)])
        total += args.rate
        time.sleep(max(0.0, 1.0 - (time.monotonic() - started)))
    print(f"published {total} events to {args.topic}")


if __name__ == "__main__":
    main()
