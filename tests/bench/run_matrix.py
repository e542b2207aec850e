"""Benchmark pynsqd against nsq 1.3.0's nsqd side by side and print one table of ratios.

Every scenario runs ``--rounds`` times on each broker, alternately (nsqd then pynsqd, then
pynsqd then nsqd, ...), each run on a fresh broker with a temporary data path; the table
gives each broker's median and pynsqd / nsqd. nsqd is nsq's own, found as the tests find
it (``$NSQ_BIN``, or the ``shared/nsq/bin`` script beside the checkout). Both brokers face
the same load generators:

- nsq's own ``bench_writer`` and ``bench_reader`` (``GOMAXPROCS`` sets their connection
  count), for the comparison rows: ``PUB`` of 100 B with 8 connections
  (``--batch-size=1``); ``MPUB`` 200 x 100 B writer alone; ``MPUB`` 200 x 100 B writer and
  reader at once; ``MPUB`` 200 x 1000 B writer and reader at once; ``MPUB`` 200 x 100 B
  writer alone under ``--mem-queue-size=0``;
- ``wrk`` (Debian's ``wrk`` package), for the HTTP rows: ``POST /pub`` with 100 B bodies
  and ``POST /mpub`` with 100 lines of 100 B, 16 keep-alive connections on 2 threads;
- ``python -m broker.bench`` (pynsqd's bench tool) for the matrix (``--matrix``)

    {100, 1000} B  x  {PUB, MPUB 200}  x  {writer, reader, both}  x  {default, --mem-queue-size=0}

  with the roles of nsq's bench.sh. writer: ``bench writer`` alone into a topic with no
  channel (kept in memory up to ``--mem-queue-size``, on disk past it). reader: the topic is
  first filled by ``bench writer`` for the run time (untimed), then ``bench reader`` drains
  it (``--count`` = what was written); its latencies include the time messages waited in
  the backlog. both: one writer and one reader started in step with ``--deadline``; the
  reader subscribes before the writer publishes.

Two groups of rows with nsq's tools run only when ``--only`` picks them, being long (a
spilling fan-out run writes one copy of every message per channel to disk):

- ``--only channels``, fan-out: ``bench_writer`` MPUB 200 x 100 B alone into a topic whose
  N channels were created beforehand (``POST /topic/create``, then ``POST /channel/create``
  for ch0 .. ch<N-1>, on either broker) and that nobody reads: ``nsq MPUB200 100B writer N
  channels`` for N = 1 (the baseline), 3, 10 and 30 at the default ``--mem-queue-size``
  (spilling), and ``... N channels mem=2000000`` for N = 10 and 30 (all in memory); and
  ``nsq MPUB200 100B both 10 channels``: the 10 channels nobody reads, plus bench_reader on
  one more (``ch``) while the writer writes, so that a broker cannot keep one copy for the
  unread channels (pynsqd's topic holds one copy only while none of its channels is read;
  broker/README.md, "How a topic's messages reach its channels"). These rows
  also measure the bytes written to disk per published message (tests/bench/matrix/disk.py):
  once the writer is done and the broker has settled (every channel holds every message), the
  growth of the data path's files (the sum of their sizes, the broker's log left out) and of
  ``write_bytes`` in the broker's ``/proc/<pid>/io`` since just before the writer, each
  divided by the topic's ``message_count`` from ``/stats``; what a broker writes when it stops
  is not counted. The same looks at ``/stats`` give the fan-out rate: messages published over
  the seconds from the writer's start until every channel held every one of them (the
  writer's rate is how fast a broker accepts; nsqd copies to the channels behind its topic's
  queue, seconds later with many channels). Both are printed as a second table (``"disk"`` in
  ``--json``).
- ``--only consumers``, many consumers: one channel read by ``bench_reader`` on N connections
  while ``bench_writer`` writes, as the "both" rows (reader subscribed first, one
  ``--deadline``): ``nsq MPUB200 100B both N consumers`` for N = 2, 16 and 64. Neither nsq tool
  has a flag for its connection count; each opens ``GOMAXPROCS`` connections, so the reader
  runs with ``GOMAXPROCS=N`` (``--rdy`` each) and the writer with the machine's default.

``--only`` matches substrings, all of them: ``--only "3 channels"`` picks the 3-channel row
alone, ``--only "10 channels" --only mem=`` the 10 channels all in memory, ``--only
"64 consumers"`` one consumer row.

Once the disk figures are taken, the channels of a fan-out row are emptied (``POST
/channel/empty``) before the broker is stopped: otherwise both brokers first write out every
message they hold in memory, which takes nsqd minutes with 30 channels x 2,000,000.

Without ``--matrix`` or ``--only`` the comparison and HTTP rows run; ``--only`` chooses
among all rows. Broker CPU is the broker's CPU seconds over the measured phase in percent
of one core (nsqd's Go runtime uses both cores, pynsqd one thread).

Usage (from the repository root)::

    python -m tests.bench.run_matrix                  # comparison + HTTP rows, 3 rounds x 10 s
    python -m tests.bench.run_matrix --quick          # 2 s per run
    python -m tests.bench.run_matrix --rounds 5 --only http
    python -m tests.bench.run_matrix --quick --rounds 2 --only channels    # fan-out, bytes per message
    python -m tests.bench.run_matrix --quick --rounds 2 --only consumers   # 2 / 16 / 64 reader connections
    python -m tests.bench.run_matrix --matrix --rounds 1 --json > matrix.json
    python -m tests.bench.run_matrix --only 100B --only MPUB --no-nsqd   # pynsqd alone, detailed table
    python -m tests.bench.run_matrix --profile py-spy --profile-dir /tmp/prof --only "MPUB200 both"
    python -m tests.bench.run_matrix --memory         # 10M x 100 B backlog, peak RSS (long)
    python -m tests.bench.run_matrix --broker-cmd "python -m broker --mem-queue-size=20000"

``--profile py-spy`` attaches ``py-spy record`` to pynsqd for the measured phase of each
run and prints the functions with the most samples; ``--profile cprofile`` runs pynsqd
under ``python -m cProfile`` and prints the top of its cumulative-time table once it has
shut down. Rows whose tool is missing (no nsq programs, no ``wrk``) are reported as errors
naming what to install.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
from pathlib import Path

from broker.bench.arguments import parse_duration
from tests.bench.matrix.profiling import summarize_stacks
from tests.bench.matrix.report import (
    comparison_table,
    disk_summary,
    disk_table,
    memory_text,
    render,
    summarize,
    table,
)
from tests.bench.matrix.rows import NSQD, PYNSQD, WRK_CONNECTIONS, WRK_THREADS, Outcome, Scenario, scenarios
from tests.bench.matrix.runs import run_memory, run_side_by_side
from tests.support.paths import nsq_bin

#: what the tests use of the runner
__all__ = ["Outcome", "Scenario", "comparison_table", "disk_summary", "disk_table", "main", "parse_args", "scenarios",
           "summarize", "summarize_stacks"]


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="2 s per run instead of 10 s")
    p.add_argument("--runfor", type=parse_duration, default=None, help="time per run (default 10s)")
    p.add_argument("--rounds", type=int, default=3,
                   help="runs per scenario and broker, alternating the brokers (default 3; the table gives medians)")
    p.add_argument("--only", action="append", default=[], metavar="TEXT",
                   help="run the rows whose name contains TEXT (repeatable, all must match), the matrix's included")
    p.add_argument("--matrix", action="store_true",
                   help="run the matrix of pynsqd's bench tool instead of the comparison rows")
    p.add_argument("--connections", type=int, default=2, help="connections per pynsqd bench tool (default 2)")
    p.add_argument("--rdy", type=int, default=2500, help="RDY per reader connection (default 2500)")
    p.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")
    p.add_argument("--broker-cmd", default=f"{shlex.quote(sys.executable)} -m broker",
                   help="command that starts pynsqd (default: python -m broker)")
    p.add_argument("--nsqd-cmd", default=None,
                   help="command that starts the reference nsqd (default: nsq 1.3.0's, as the tests find it)")
    p.add_argument("--no-nsqd", action="store_true",
                   help="run pynsqd alone and print every run's details (rates, latencies, CPU, memory)")
    p.add_argument("--profile", choices=("py-spy", "cprofile"), default=None,
                   help="profile pynsqd during each measured phase")
    p.add_argument("--profile-dir", type=Path, default=None, help="where profiles go (default: a temp dir)")
    p.add_argument("--profile-rate", type=int, default=250, help="py-spy samples per second (default 250)")
    p.add_argument("--memory", action="store_true",
                   help="instead of the rows: a 100 B backlog in a channel nobody reads, pynsqd's peak RSS")
    p.add_argument("--memory-count", type=int, default=10_000_000, help="backlog size (default 10000000)")
    p.add_argument("--memory-drain", action="store_true", help="then drain the backlog with bench reader")
    p.add_argument("--keep-data", action="store_true", help="keep the brokers' data directories")
    p.add_argument("--render", type=Path, default=None, metavar="FILE",
                   help="print the table of a saved --json run instead of running anything")
    opts = p.parse_args(argv)
    opts.runfor = opts.runfor or (2.0 if opts.quick else 10.0)
    opts.command = shlex.split(opts.broker_cmd)
    if opts.rounds < 1:
        p.error("--rounds must be at least 1")
    opts.brokers = [(PYNSQD, opts.command)]
    if not opts.no_nsqd:
        nsqd = shlex.split(opts.nsqd_cmd) if opts.nsqd_cmd else _nsqd_command()
        if nsqd is None:
            p.error("nsq 1.3.0's nsqd is not here (set NSQ_BIN, or put nsq's bin script at ../shared/nsq/bin; "
                    "or run pynsqd alone with --no-nsqd)")
        opts.brokers.insert(0, (NSQD, nsqd))
    return opts


def _nsqd_command() -> list[str] | None:
    folder = nsq_bin()
    return None if folder is None else [str(folder / "nsqd")]


def _header(opts: argparse.Namespace, chosen: list[Scenario]) -> str:
    brokers = "; ".join(f"{name}: {shlex.join(command)}" for name, command in opts.brokers)
    return (f"# {brokers}\n# {opts.runfor:g}s per run, {opts.rounds} round(s) per broker alternating, medians; "
            f"nsq's tools: GOMAXPROCS connections (2 unless given); wrk: {WRK_THREADS} threads, "
            f"{WRK_CONNECTIONS} connections; pynsqd bench: {opts.connections} connections, reader RDY {opts.rdy}")


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(sys.argv[1:] if argv is None else argv)
    if opts.render is not None:
        print(render(json.loads(opts.render.read_text())))
        return 0
    with tempfile.TemporaryDirectory(prefix="pynsqd-bench-") as tmp:
        work = Path(tmp)
        if opts.profile and opts.profile_dir is None:
            opts.profile_dir = Path(tempfile.mkdtemp(prefix="pynsqd-profile-"))
        if opts.profile_dir is not None:
            opts.profile_dir.mkdir(parents=True, exist_ok=True)
        if opts.memory:
            result = run_memory(opts, work)
            print(json.dumps(result, indent=2) if opts.json else memory_text(result))
            return 0
        chosen = scenarios(opts.only, opts.matrix)
        if not chosen:
            print(f"no row matches {opts.only}", file=sys.stderr)
            return 2
        outcomes = run_side_by_side(opts, work, chosen)
    side_by_side = len(opts.brokers) > 1
    names = [name for name, _ in opts.brokers]
    summary = summarize(outcomes, names) if side_by_side else []
    disk = disk_summary(outcomes, names)
    if opts.json:
        runs = [o.as_dict() for o in outcomes]
        print(json.dumps({"brokers": {name: command for name, command in opts.brokers}, "runfor_s": opts.runfor,
                          "rounds": opts.rounds, "summary": summary, "disk": disk, "runs": runs}
                         if side_by_side else runs, indent=2))
    else:
        print(_header(opts, chosen))
        print(comparison_table(summary) if side_by_side else table(outcomes))
        if disk:
            print(f"\n# fan-out rate and bytes written to disk per published message (medians; "
                  f"see tests/bench/matrix/disk.py)\n"
                  f"{disk_table(disk, names)}")
        for o in outcomes:
            if o.profile:
                print(f"\n## profile: {o.scenario.name} round {o.round + 1} "
                      f"({o.profile.get('samples', o.profile.get('seconds', '?'))} samples/seconds)")
                if "error" in o.profile:
                    print(f"  {o.profile['error']}")
                for row in o.profile.get("top", ()):
                    print(f"  {row['self_pct']:>5}% self {row['inclusive_pct']:>5}% incl  {row['function']}")
        if opts.profile_dir:
            print(f"\n# profiles in {opts.profile_dir}")
    return 1 if any(o.error for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
