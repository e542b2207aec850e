"""The rows of the side-by-side matrix: scenarios, the comparison rows, the fan-out and
many-consumer rows, and what one run measured."""

from __future__ import annotations

from dataclasses import dataclass, field

SIZES = (100, 1000)


PUBLISH = (("PUB", 1), ("MPUB200", 200))


ROLES = ("writer", "reader", "both")


MEM_QUEUE = (None, 0)  # None: the broker's default


#: the reader and writer of "both" are started this long before their deadline
STEP_DELAY = 2.0


TOPIC = "sub_bench"


CHANNEL = "ch"


#: ``--mem-queue-size`` of the fan-out rows that keep every channel's messages in memory
ALL_IN_MEMORY = 2_000_000


#: wrk's load for the HTTP rows: threads and keep-alive connections
WRK_THREADS = 2


WRK_CONNECTIONS = 16


PYNSQD, NSQD = "pynsqd", "nsqd"


@dataclass(frozen=True, slots=True)
class Scenario:
    """One row: what load, from which tool, against a broker with which ``--mem-queue-size``.

    ``tool`` is ``nsq`` (nsq's bench_writer/bench_reader, ``connections`` of them per tool),
    ``wrk`` (HTTP ``path``, ``batch`` lines of ``size`` bytes per request) or ``bench``
    (``python -m broker.bench``). ``channels`` (nsq writer rows): that many channels of the
    topic are created over HTTP before the writer starts, nobody reads them, and the run also
    measures the bytes written to disk per published message. ``readers`` (nsq "both" rows):
    bench_reader's connection count (its ``GOMAXPROCS``), the writer keeping ``connections``.
    """

    tool: str
    size: int
    batch: int
    role: str
    mem_queue_size: int | None = None
    connections: int | None = None
    path: str = ""
    channels: int | None = None
    readers: int | None = None

    @property
    def publish(self) -> str:
        return "PUB" if self.batch == 1 else f"MPUB{self.batch}"

    @property
    def name(self) -> str:
        mem = "" if self.mem_queue_size is None else f" mem={self.mem_queue_size}"
        if self.tool == "wrk":
            lines = f"{self.batch}x" if self.batch > 1 else ""
            return f"http {self.path} {lines}{self.size}B x{WRK_CONNECTIONS}{mem}"
        if self.tool == "nsq":
            conns = f" x{self.connections}" if self.connections else ""
            # "N channels", not "channels=N": --only "3 channels" must not pick "30 channels"
            shape = (f" {self.channels} channels" if self.channels else "") + (
                f" {self.readers} consumers" if self.readers else "")
            return f"nsq {self.publish} {self.size}B{conns} {self.role}{shape}{mem}"
        return f"{self.size}B {self.publish} {self.role} {'mem=default' if self.mem_queue_size is None else mem.strip()}"

    def as_dict(self) -> dict:
        return {"tool": self.tool, "size": self.size, "batch_size": self.batch, "role": self.role,
                "mem_queue_size": self.mem_queue_size, "connections": self.connections, "path": self.path,
                "channels": self.channels, "readers": self.readers}


#: The rows of the side-by-side comparison: nsq's own tools, then HTTP.
COMPARISON = (
    Scenario("nsq", 100, 1, "writer", connections=8),
    Scenario("nsq", 100, 200, "writer"),
    Scenario("nsq", 100, 200, "both"),
    Scenario("nsq", 1000, 200, "both"),
    Scenario("nsq", 100, 200, "writer", mem_queue_size=0),
    Scenario("wrk", 100, 1, "writer", path="/pub"),
    Scenario("wrk", 100, 100, "writer", path="/mpub"),
)


#: Fan-out (``--only channels``): bench_writer MPUB 200 x 100 B into a topic with N channels
#: created beforehand and nobody reading, spilling at the default --mem-queue-size and all in
#: memory; 1 channel is the baseline. Not in the default run (a run writes N copies to disk).
#: The "both" row adds bench_reader on one more channel while the N are not read: the topic
#: cannot hold one copy for all of them then (see broker/core/fanout/plain.py), each keeps its own.
CHANNEL_ROWS = (
    *(Scenario("nsq", 100, 200, "writer", channels=n) for n in (1, 3, 10, 30)),
    *(Scenario("nsq", 100, 200, "writer", mem_queue_size=ALL_IN_MEMORY, channels=n) for n in (10, 30)),
    Scenario("nsq", 100, 200, "both", channels=10),
)


#: Many consumers (``--only consumers``): one channel read by bench_reader on N connections
#: while bench_writer (default connections) writes, as the "both" rows. Not in the default run.
CONSUMER_ROWS = tuple(Scenario("nsq", 100, 200, "both", readers=n) for n in (2, 16, 64))


@dataclass(slots=True)
class Outcome:
    """What one run of one scenario on one broker measured."""

    scenario: Scenario
    broker: str = PYNSQD
    round: int = 0
    writer: dict | None = None
    reader: dict | None = None
    prefilled: int | None = None
    broker_cpu_s: float = 0.0
    busy_s: float = 0.0  # the whole machine's busy CPU seconds over the same window
    harness_cpu_s: float = 0.0  # this runner and the bench processes, start-up included
    window_s: float = 0.0  # wall time over which busy_s, harness_cpu_s and broker_cpu_s were taken
    measured_s: float = 0.0
    peak_rss_mb: float = 0.0
    rss_mb: float = 0.0
    profile: dict = field(default_factory=dict)  # {"samples": N, "top": [...]}
    disk: dict | None = None  # the rows with channels: see tests.bench.matrix.disk
    error: str | None = None

    @property
    def tool_cpu_s(self) -> float:
        """CPU seconds of the bench tools over their timed runs (when they report it)."""
        return sum(x["cpu"]["user_s"] + x["cpu"]["system_s"] for x in (self.writer, self.reader) if x and "cpu" in x)

    @property
    def other_cpu_s(self) -> float:
        """Busy CPU seconds of everything else on the machine: load that skews the numbers."""
        return max(self.busy_s - self.broker_cpu_s - self.harness_cpu_s, 0.0)

    @property
    def broker_cpu_percent(self) -> float | None:
        return 100 * self.broker_cpu_s / self.measured_s if self.measured_s else None

    @classmethod
    def from_dict(cls, d: dict) -> Outcome:
        """The inverse of as_dict (for ``--render``)."""
        broker = d["broker"]
        runs = [r for r in (d["writer"], d["reader"]) if r]
        scenario = Scenario(d.get("tool", "bench"), d["size"], d["batch_size"], d["role"], d["mem_queue_size"],
                            d.get("connections"), d.get("path", ""), d.get("channels"), d.get("readers"))
        return cls(
            scenario, broker=d.get("broker_name", PYNSQD), round=d.get("round", 0),
            writer=d["writer"], reader=d["reader"], prefilled=d["prefilled"], broker_cpu_s=broker["cpu_s"],
            busy_s=broker["cpu_s"] + d["other_cpu_s"], window_s=d["window_s"],
            measured_s=max((r["duration_s"] for r in runs), default=0.0), peak_rss_mb=broker["peak_rss_mb"],
            rss_mb=broker["rss_mb"], profile=d["profile"], disk=d.get("disk"), error=d["error"])

    def as_dict(self) -> dict:
        s = self.scenario
        return {
            "scenario": s.name,
            **s.as_dict(),
            "publish": s.publish,
            "broker_name": self.broker,
            "round": self.round,
            "writer": self.writer,
            "reader": self.reader,
            "prefilled": self.prefilled,
            "broker": {
                "cpu_s": self.broker_cpu_s,
                "cpu_percent": self.broker_cpu_percent,
                "peak_rss_mb": self.peak_rss_mb,
                "rss_mb": self.rss_mb,
            },
            "tool_cpu_s": self.tool_cpu_s,
            "other_cpu_s": self.other_cpu_s,
            "window_s": self.window_s,
            "profile": self.profile,
            "disk": self.disk,
            "error": self.error,
        }


def matrix() -> list[Scenario]:
    """The matrix driven by pynsqd's bench tool."""
    return [Scenario("bench", size, batch, role, mem)
            for mem in MEM_QUEUE for size in SIZES for _, batch in PUBLISH for role in ROLES]


def scenarios(only: list[str], with_matrix: bool) -> list[Scenario]:
    """The rows to run: the comparison rows, the matrix when asked, and with ``only`` every row
    whose name contains all of ``only`` (case-insensitive), the fan-out and consumer rows included."""
    if not only:
        return matrix() if with_matrix else list(COMPARISON)
    rows = (*COMPARISON, *CHANNEL_ROWS, *CONSUMER_ROWS, *matrix())
    return [s for s in rows if all(o.lower() in s.name.lower() for o in only)]
