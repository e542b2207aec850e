"""Publish random JSON events for windowed_counts.py through nsqd's HTTP API (/mpub).

    python spark/examples/publish_events.py --http 127.0.0.1:4151 --rate 200 --seconds 60 --drain

Each second it publishes ``--rate`` events stamped with the current time, and a
few deliberately late ones (up to ``--late`` seconds old) to exercise the
watermark. Progress goes to stderr every ``--progress`` seconds.

windowed_counts.py emits a window only once the watermark (the newest event
time seen, less the allowed lateness) has passed its end, so the last windows of
a run wait for newer events. ``--drain`` publishes them: after the run it waits
for the window length plus the lateness (15 s, windowed_counts.py's defaults)
and publishes one more event, of kind ``drain``, stamped with the time then. That
event moves the watermark past every window of the run; its own window is
emitted with the next run. Uses only the standard library.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from http.client import HTTPException

KINDS = ("click", "view", "purchase")
PROG = "publish_events.py"


class PublishError(Exception):
    """nsqd could not be reached or refused the events; the message says which, in one line."""


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--http", default="127.0.0.1:4151", help="nsqd HTTP address (default %(default)s)")
    parser.add_argument("--topic", default="events", help="topic to publish to (default %(default)s)")
    parser.add_argument("--rate", type=int, default=100, help="events per second (default %(default)s)")
    parser.add_argument("--seconds", type=int, default=30, help="how long to publish (default %(default)s)")
    parser.add_argument("--late", type=float, default=3.0,
                        help="maximum lateness of the late events, seconds (default %(default)s)")
    parser.add_argument("--seed", type=int, default=None, help="random seed, for a repeatable run")
    parser.add_argument("--progress", type=float, default=5.0,
                        help="seconds between progress lines on stderr (default %(default)s)")
    parser.add_argument("--drain", type=float, nargs="?", const=15.0, default=None, metavar="SECONDS",
                        help="after the run, wait SECONDS (default 15: windowed_counts.py's window plus its "
                             "lateness) and publish one 'drain' event that moves the watermark past every "
                             "window of the run")
    return parser.parse_args(argv)


def stamp(moment: datetime) -> str:
    """An event time as windowed_counts.py reads it: ISO 8601 in UTC, milliseconds."""
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def event(rng: random.Random, now: datetime, late: float) -> bytes:
    """One JSON event; one in twenty is up to ``late`` seconds old."""
    if rng.random() < 0.05:
        now -= timedelta(seconds=rng.uniform(0, late))
    return json.dumps({"time": stamp(now), "kind": rng.choice(KINDS), "amount": round(rng.uniform(1, 100), 2)}).encode()


def drain_event(now: datetime) -> bytes:
    """The event ``--drain`` publishes: only its time matters."""
    return json.dumps({"time": stamp(now), "kind": "drain", "amount": 0}).encode()


def publish(http: str, topic: str, bodies: list[bytes]) -> None:
    """POST newline-separated bodies to /mpub (JSON bodies contain no newline)."""
    url = f"http://{http}/mpub?topic={topic}"
    request = urllib.request.Request(url, data=b"\n".join(bodies), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()
    except urllib.error.HTTPError as exc:
        raise PublishError(f"nsqd at {url} answered {exc.code} {exc.read().decode(errors='replace').strip()}") from exc
    except (HTTPException, ConnectionResetError) as exc:
        # what a TCP port does with HTTP: nsqd answers a framed E_BAD_PROTOCOL and closes
        raise PublishError(f"nsqd at {url} did not answer HTTP ({type(exc).__name__}); is {http} nsqd's HTTP "
                           f"port (4151 by default), not its TCP port (4150)?") from exc
    except (urllib.error.URLError, OSError) as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        if isinstance(reason, ConnectionResetError):
            raise PublishError(f"nsqd at {url} did not answer HTTP (ConnectionResetError); is {http} nsqd's "
                               f"HTTP port (4151 by default), not its TCP port (4150)?") from exc
        reason = getattr(reason, "strerror", None) or reason
        raise PublishError(f"cannot reach nsqd at {url}: {reason}") from exc


def run(args: argparse.Namespace) -> int:
    """Publish for ``args.seconds`` seconds (then the drain event); the number of events published."""
    rng = random.Random(args.seed)
    total = 0
    began = last_report = time.monotonic()
    for _ in range(args.seconds):
        started = time.monotonic()
        publish(args.http, args.topic, [event(rng, datetime.now(UTC), args.late) for _ in range(args.rate)])
        total += args.rate
        time.sleep(max(0.0, 1.0 - (time.monotonic() - started)))
        now = time.monotonic()
        if now - last_report >= args.progress:
            print(f"{PROG}: {total} events sent in {now - began:.0f} s ({total / (now - began):.0f}/s)",
                  file=sys.stderr)
            last_report = now
    if args.drain is not None:
        print(f"{PROG}: waiting {args.drain:g} s for the last window to close, then publishing the drain event",
              file=sys.stderr)
        time.sleep(args.drain)
        publish(args.http, args.topic, [drain_event(datetime.now(UTC))])
    return total


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        total = run(args)
    except PublishError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    drained = " and the drain event" if args.drain is not None else ""
    print(f"published {total} events{drained} to {args.topic}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
