"""A replicated ``pynsqd`` cluster on loopback, and the clients that work against it: the
replication tests (``tests/system/test_replication*.py``) and the chaos harness
(``tests/bench/chaos_replication.py``) share them.

- :class:`ReplicaCluster`: one of nsq's ``nsqlookupd`` and N ``pynsqd`` nodes registered with it
  (``--broadcast-address=127.0.0.1``), each on fixed ports of its own so that a node killed and
  started again keeps its address (a wiped node keeps it too, and comes back as a new node).
  With ``own_ips`` each node listens on a loopback address of its own instead (node n on
  127.B.0.(n+2), its TCP and HTTP ports and ``--broadcast-address`` there, B a block of the
  process's own (:func:`loopback_block`) so that the partitions of two clusters run at the
  same time never cut each other's nodes), from which it also dials its peers, so that a
  firewall can separate nodes (:mod:`tests.support.partitions`) while nsqlookupd and the
  clients, on 127.0.0.1, still reach every node;
- :class:`Node`: one of them; killed (SIGKILL), wiped, paused (SIGSTOP), resumed (SIGCONT), started;
- :class:`Consumer`: a consumer that follows ``nsqlookupd`` as real ones do (``/lookup?topic=T``
  every ``poll`` seconds, a connection to every producer listed, RDY, FIN of every message),
  or one that is given fixed addresses; it records every body delivered and when;
- :func:`pub`: one PUB and its answer (``OK`` or the error frame's text).

The replica flags (``--replicas``, ``--replica-timeout``) are left out for ``replicas=1`` with no
timeout given, so that the same code runs against a broker without them.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import trio

from broker.protocol import (
    FRAME_TYPE_ERROR,
    FRAME_TYPE_MESSAGE,
    FRAME_TYPE_RESPONSE,
    decode_message,
    encode_fin,
    encode_nop,
    encode_pub,
    encode_rdy,
    encode_sub,
)
from tests.support.http_client import request
from tests.support.nsq_programs import NsqProgram
from tests.support.processes import BrokerProcess
from tests.support.v2client import V2Client, connect

__all__ = ["DISCONNECTED", "LOOPBACK", "PROBE_TOPIC", "Consumer", "Deliveries", "Node", "ReplicaCluster", "free_ports",
           "pub", "replica_flags"]

LOOPBACK = "--broadcast-address=127.0.0.1"
#: The topic :meth:`ReplicaCluster.wait_replicating` publishes its probes to.
PROBE_TOPIC = "replication_probe"
#: What a client sees when the node under it was killed, paused or refused the connection.
DISCONNECTED = (EOFError, trio.BrokenResourceError, trio.ClosedResourceError, OSError, trio.TooSlowError)


def replica_flags(replicas: int, replica_timeout: str | None = None) -> list[str]:
    """``--replicas`` and ``--replica-timeout`` (nothing for one replica and no timeout: the defaults)."""
    flags = [] if replicas == 1 else [f"--replicas={replicas}"]
    if replica_timeout is not None:
        flags.append(f"--replica-timeout={replica_timeout}")
    return flags


def loopback_block() -> int:
    """The second byte of this process's nodes' loopback addresses (1 to 250; 127.0.0.x is
    the clients' and nsqlookupd's). ``PYNSQD_LOOPBACK_BLOCK`` sets it: two chaos runs given
    the same block partition each other's nodes too (two failures at once)."""
    return int(os.environ.get("PYNSQD_LOOPBACK_BLOCK", os.getpid() % 250 + 1))


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct TCP ports on ``host`` that nothing listens on now."""
    probes = [socket.socket() for _ in range(count)]
    try:
        for probe in probes:
            probe.bind((host, 0))
        return [probe.getsockname()[1] for probe in probes]
    finally:
        for probe in probes:
            probe.close()


class Node:
    """One ``pynsqd`` of a :class:`ReplicaCluster` on its own fixed TCP and HTTP ports, on ``ip``.

    ``state`` is what was last done to it: ``"new"``, ``"up"``, ``"down"`` (killed) or ``"paused"``.
    """

    def __init__(self, cluster: ReplicaCluster, index: int, ip: str, tcp_port: int, http_port: int):
        self.cluster = cluster
        self.index = index
        self.name = f"node{index}"
        self.ip = ip
        self.data_path = cluster.root / self.name / "data"
        self.log_path = cluster.root / f"{self.name}.log"
        self.tcp = (ip, tcp_port)
        self.http = (ip, http_port)
        self.proc: BrokerProcess | None = None
        self.state = "new"
        self.starts = 0

    @property
    def address(self) -> str:
        """``host:port`` of its TCP listener, as nsqlookupd lists it and :class:`Deliveries` names it."""
        return f"{self.ip}:{self.tcp[1]}"

    def flags(self) -> list[str]:
        return [*self.cluster.node_flags(), f"--broadcast-address={self.ip}", f"--node-id={100 + self.index}",
                f"--tcp-address={self.ip}:{self.tcp[1]}", f"--http-address={self.ip}:{self.http[1]}"]

    def start(self, timeout: float = 30.0) -> Node:
        """Start it (on its data directory as it is) and return once it listens."""
        assert self.state in ("new", "down"), self.state
        with open(self.log_path, "ab") as log:
            log.write(f"==== harness: start #{self.starts + 1} of {self.name}\n".encode())
        self.proc = BrokerProcess(self.data_path, *self.flags(), log_path=self.log_path).start(timeout)
        self.state = "up"
        self.starts += 1
        return self

    async def astart(self, timeout: float = 30.0) -> Node:
        """:meth:`start` in a thread, so that the clients of the caller's event loop keep running."""
        return await trio.to_thread.run_sync(self.start, timeout)

    def kill(self) -> None:
        """SIGKILL (a stopped process dies too) and wait for it."""
        if self.proc is not None:
            self.proc.kill()
        self.state = "down"

    def wipe(self) -> None:
        """Delete its data directory: it starts again as a new node. Only while it is down."""
        assert self.state in ("new", "down"), self.state
        shutil.rmtree(self.data_path, ignore_errors=True)

    def pause(self) -> None:
        assert self.proc is not None and self.proc.proc is not None and self.state == "up"
        os.kill(self.proc.proc.pid, signal.SIGSTOP)
        self.state = "paused"

    def resume(self) -> None:
        assert self.proc is not None and self.proc.proc is not None and self.state == "paused"
        os.kill(self.proc.proc.pid, signal.SIGCONT)
        self.state = "up"

    def exited(self) -> int | None:
        """Its exit status if it is meant to run (up or paused) but its process has ended by itself."""
        if self.state in ("up", "paused") and self.proc is not None and self.proc.proc is not None:
            return self.proc.proc.poll()
        return None

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def log_lines(self, *words: str) -> list[str]:
        """The lines of its log that contain any of ``words`` (case-insensitive)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return []
        lowered = [w.lower() for w in words]
        return [line for line in text.splitlines() if any(w in line.lower() for w in lowered)]

    async def stats(self, topic: str | None = None, timeout: float = 5.0) -> dict | None:
        """Its ``/stats?format=json`` (of ``topic``), None when it does not answer in ``timeout`` seconds."""
        target = "/stats?format=json" + (f"&topic={topic}" if topic else "")
        with trio.move_on_after(timeout):
            try:
                reply = await request(self.http, "GET", target)
            except DISCONNECTED:
                return None
            return reply.json() if reply.status == 200 else None
        return None

    async def http_call(self, method: str, target: str, body: bytes | None = None):
        reply = await request(self.http, method, target, body)
        assert reply.status == 200, (self.name, method, target, reply.status, reply.body)
        return reply


class ReplicaCluster:
    """One ``nsqlookupd`` and ``nodes`` ``pynsqd`` registered with it, under ``root``; nothing
    runs until :meth:`start`, and the caller must :meth:`stop` it (in a ``finally``)."""

    def __init__(self, root: Path, nodes: int, *, replicas: int = 1, replica_timeout: str | None = None,
                 durable: bool = False, extra: Iterable[str] = (), own_ips: bool = False):
        self.root = root
        self.replicas = replicas
        self.replica_timeout = replica_timeout
        self.durable = durable
        self.extra = list(extra)
        root.mkdir(parents=True, exist_ok=True)
        # the nodes prove to each other that they hold the cluster's secret, as deploy/README.md says to run them
        self.secret_file = root / "replication.secret"
        self.secret_file.write_text(os.urandom(16).hex() + "\n")
        self.secret_file.chmod(0o600)
        ports = free_ports(2)
        self.nodes = []
        for n in range(nodes):
            ip = f"127.{loopback_block()}.0.{n + 2}" if own_ips else "127.0.0.1"
            self.nodes.append(Node(self, n, ip, *free_ports(2, ip)))
        # fixed ports too, so that it can be started again where the nodes look for it
        self.lookupd = NsqProgram("nsqlookupd", root / "lookupd.log", f"--tcp-address=127.0.0.1:{ports[0]}",
                                  f"--http-address=127.0.0.1:{ports[1]}", LOOPBACK)

    def node_flags(self) -> list[str]:
        """The flags every node gets (each adds its addresses, ``--broadcast-address`` and ``--node-id``)."""
        return [f"--lookupd-tcp-address={self.lookupd.address('TCP')}",
                *(["--durable"] if self.durable else []),
                *replica_flags(self.replicas, self.replica_timeout),
                *([f"--replication-secret-file={self.secret_file}"] if self.replicas > 1 else []), *self.extra]

    def start(self) -> ReplicaCluster:
        self.lookupd.start()
        for node in self.nodes:
            node.start()
        return self

    def stop(self) -> None:
        for node in self.nodes:
            node.kill()
        self.lookupd.kill()

    def lookupd_exited(self) -> int | None:
        """nsqlookupd's exit status if it has ended (it is never stopped before :meth:`stop`)."""
        return self.lookupd.proc.poll() if self.lookupd.proc is not None else None

    def crashed(self) -> dict[str, int]:
        """The nodes meant to run whose process has ended by itself, with their exit status."""
        return {node.name: status for node in self.nodes if (status := node.exited()) is not None}

    def up(self) -> list[Node]:
        return [node for node in self.nodes if node.state == "up"]

    async def lookup(self, topic: str) -> set[tuple[str, int]]:
        """The producers of ``topic`` nsqlookupd hands to a consumer (empty when it does not answer)."""
        assert self.lookupd.http is not None, "nsqlookupd is not running"
        try:
            with trio.fail_after(5):
                reply = await request(self.lookupd.http, "GET", f"/lookup?topic={topic}")
        except DISCONNECTED:
            return set()
        if reply.status != 200:
            return set()
        return {(p["broadcast_address"], p["tcp_port"]) for p in reply.json()["producers"]}

    async def create(self, topic: str, channels: Iterable[str], nodes: Iterable[Node] | None = None) -> None:
        """Create ``topic`` and its ``channels`` on ``nodes`` (default: every node that is up)."""
        for node in self.up() if nodes is None else nodes:
            await node.http_call("POST", f"/topic/create?topic={topic}")
            for channel in channels:
                await node.http_call("POST", f"/channel/create?topic={topic}&channel={channel}")

    async def wait_registered(self, topic: str, nodes: Iterable[Node], timeout: float = 15.0) -> None:
        """Return once nsqlookupd lists every one of ``nodes`` as a producer of ``topic``."""
        wanted = {node.tcp for node in nodes}
        with trio.fail_after(timeout):
            while not wanted <= await self.lookup(topic):
                await trio.sleep(0.05)

    async def wait_replicating(self, nodes: Iterable[Node] | None = None, timeout: float = 30.0) -> None:
        """Return once each of ``nodes`` (default: every node that is up) acknowledges a publish, that
        is once it has found enough peers through nsqlookupd to place its copies; a node refuses
        publishes until then. The probes go to a topic of their own, :data:`PROBE_TOPIC`."""
        with trio.fail_after(timeout):
            for node in self.up() if nodes is None else nodes:
                while True:
                    try:
                        client = await connect(node.tcp, timeout=timeout)
                        try:
                            if await pub(client, PROBE_TOPIC, b"probe", timeout) == "OK":
                                break
                        finally:
                            await client.aclose()
                    except DISCONNECTED:
                        pass
                    await trio.sleep(0.1)  # nodes look for peers every so often; no event to wait on

    async def wait_linked(self, nodes: Iterable[Node] | None = None, timeout: float = 30.0) -> None:
        """Return once each of ``nodes`` (default: every node that is up) has dialled every other one
        of them and has its link up: each knows the others' addresses, so that a node that comes back
        wiped at one of them replaces the member that was there (a node that was only dialled is
        known without an address)."""
        group = list(self.up() if nodes is None else nodes)

        async def linked() -> bool:
            for node in group:
                peers = ((await node.stats()) or {}).get("replication", {}).get("peers", ())
                up = {peer["address"] for peer in peers if peer["connected"]}
                if not {other.address for other in group if other is not node} <= up:
                    return False
            return True

        with trio.fail_after(timeout):
            while not await linked():
                await trio.sleep(0.1)  # nodes look for peers every second; no event to wait on

    def logs(self, lines: int = 30) -> str:
        """The last ``lines`` lines of every node's log, for a failure message."""
        return "\n".join(f"---- {node.name} ({node.state}) {node.log_path}\n{node.log_tail(lines)}"
                         for node in self.nodes)


async def publish_all(node: Node, topic: str, items: list[bytes], timeout: float = 15.0) -> None:
    """PUB each body to ``topic`` on ``node`` and require ``OK`` for every one (each within ``timeout``)."""
    client = await connect(node.tcp, timeout=10)
    try:
        for body in items:
            answer = await pub(client, topic, body, timeout=timeout)
            assert answer == "OK", (body, answer)
    finally:
        await client.aclose()


async def pub(client: V2Client, topic: str, body: bytes, timeout: float) -> str:
    """PUB ``body`` on ``client`` and return ``"OK"`` or the text of the error frame that answered
    it (heartbeats skipped). Raises one of :data:`DISCONNECTED` when the connection broke or no
    answer came within ``timeout`` seconds."""
    await client.send(encode_pub(topic, body))
    with trio.fail_after(timeout):
        while True:
            frame = await client.read_frame(skip_heartbeats=False)
            if frame.frame_type == FRAME_TYPE_RESPONSE:
                if frame.data == b"_heartbeat_":
                    await client.send(encode_nop())
                    continue
                return frame.data.decode(errors="replace")
            if frame.frame_type == FRAME_TYPE_ERROR:
                return frame.data.decode(errors="replace")
            raise AssertionError(f"unexpected frame to a publisher: {frame}")


@dataclass
class Deliveries:
    """What the consumers of one channel were given: how often each body came, when it came first."""

    counts: Counter[bytes] = field(default_factory=Counter)
    first: dict[bytes, float] = field(default_factory=dict)
    #: body -> the node (``host:port``) that delivered it first
    first_node: dict[bytes, str] = field(default_factory=dict)
    #: deliveries, by the node (``host:port``) that made them
    by_node: Counter[str] = field(default_factory=Counter)
    total: int = 0
    #: deliveries of a body that had been delivered before (on this channel)
    extra: int = 0
    #: body -> (when, node) of each delivery after its first
    again: dict[bytes, list[tuple[float, str]]] = field(default_factory=dict)

    def record(self, body: bytes, node: str, now: float) -> None:
        self.total += 1
        self.by_node[node] += 1
        if self.counts[body]:
            self.extra += 1
            self.again.setdefault(body, []).append((now, node))
        else:
            self.first[body] = now
            self.first_node[body] = node
        self.counts[body] += 1

    def missing(self, bodies: Iterable[bytes]) -> list[bytes]:
        return [body for body in bodies if body not in self.first]

    def deliveries_of(self, body: bytes) -> list[tuple[float, str]]:
        """(when, node) of each delivery of ``body``, first first."""
        if body not in self.first:
            return []
        return [(self.first[body], self.first_node[body]), *self.again.get(body, ())]

    def delivered_by_both(self, side: Iterable[str], since: float = float("-inf"),
                          until: float = float("inf")) -> list[bytes]:
        """The bodies delivered, between ``since`` and ``until``, both by a node of ``side``
        (``host:port``) and by a node that is not."""
        nodes = set(side)
        found = []
        for body in [*self.again]:  # only a body delivered more than once can be
            by = {node in nodes for when, node in self.deliveries_of(body) if since <= when <= until}
            if by == {True, False}:
                found.append(body)
        return found


class _Connection:
    def __init__(self, client: V2Client):
        self.client = client
        self.lock = trio.Lock()  # one writer at a time: the reader's FINs, a hold's or release's RDY

    async def send(self, data: bytes) -> None:
        async with self.lock:
            await self.client.send(data)


class Consumer:
    """A consumer of ``topic``/``channel`` that follows nsqlookupd at ``lookupd_http`` (asked every
    ``poll`` seconds, as real consumers do), or that connects to the fixed ``addresses``.

    It connects to every producer it is given that it is not connected to (a connection attempt,
    SUB included, must finish within ``connect_timeout`` seconds: a paused node is listed and
    accepts connections but never answers), sends RDY ``rdy`` (0 while held: :meth:`hold`), FINs
    every message, and records each delivery in :attr:`deliveries` (which consumers of one
    channel may share: pass the same ``deliveries``). A connection that gets no frame for
    ``stall`` seconds (heartbeats come every ``heartbeat_ms``) is dropped. Run it with
    ``nursery.start(consumer.run)``; it runs until cancelled.
    """

    def __init__(self, topic: str, channel: str, *, lookupd_http: tuple[str, int] | None = None,
                 addresses: Iterable[tuple[str, int]] = (), rdy: int = 200, poll: float = 1.0,
                 connect_timeout: float = 3.0, stall: float = 8.0, heartbeat_ms: int = 2000,
                 deliveries: Deliveries | None = None):
        assert lookupd_http is not None or addresses, "a consumer needs nsqlookupd or addresses"
        self.topic = topic
        self.channel = channel
        self.lookupd_http = lookupd_http
        self.addresses = set(addresses)
        self.rdy = rdy
        self.poll = poll
        self.connect_timeout = connect_timeout
        self.stall = stall
        self.heartbeat_ms = heartbeat_ms
        self.deliveries = deliveries if deliveries is not None else Deliveries()
        self.connections: dict[tuple[str, int], _Connection] = {}
        self.connecting: set[tuple[str, int]] = set()
        self.connect_failures = 0
        self.errors: list[str] = []
        self.held = False
        self._nursery: trio.Nursery | None = None

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            while True:
                for address in await self._producers():
                    self.connect(address)
                await trio.sleep(self.poll)  # how often a real consumer asks nsqlookupd

    def connect(self, address: tuple[str, int]) -> None:
        """Open a connection to ``address`` unless there is one (or one is being opened)."""
        if self._nursery is None or address in self.connections or address in self.connecting:
            return
        self.connecting.add(address)
        self._nursery.start_soon(self._connection, address)

    async def _producers(self) -> set[tuple[str, int]]:
        found = set(self.addresses)
        if self.lookupd_http is not None:
            try:
                with trio.fail_after(5):
                    reply = await request(self.lookupd_http, "GET", f"/lookup?topic={self.topic}")
                if reply.status == 200:
                    found |= {(p["broadcast_address"], p["tcp_port"]) for p in reply.json()["producers"]}
            except DISCONNECTED:
                pass
        return found

    async def hold(self) -> None:
        """RDY 0 on every connection (and on new ones) until :meth:`release`."""
        self.held = True
        await self._rdy_all(0)

    async def release(self) -> None:
        self.held = False
        await self._rdy_all(self.rdy)

    async def _rdy_all(self, count: int) -> None:
        for connection in list(self.connections.values()):
            try:
                with trio.fail_after(2):
                    await connection.send(encode_rdy(count))
            except DISCONNECTED:
                pass  # its reader sees the break and drops it

    def connected_to(self, node: Node) -> bool:
        return node.tcp in self.connections

    async def _connection(self, address: tuple[str, int]) -> None:
        node = f"{address[0]}:{address[1]}"
        client: V2Client | None = None
        try:
            try:
                with trio.fail_after(self.connect_timeout):
                    client = await connect(address, timeout=self.connect_timeout)
                    await client.identify(heartbeat_interval=self.heartbeat_ms, feature_negotiation=True)
                    await client.send(encode_sub(self.topic, self.channel))
                    await client.expect_response(b"OK")
            except (*DISCONNECTED, AssertionError):
                self.connect_failures += 1
                return
            finally:
                self.connecting.discard(address)
            client.timeout = self.stall
            connection = _Connection(client)
            self.connections[address] = connection
            try:
                await connection.send(encode_rdy(0 if self.held else self.rdy))
                while True:
                    frame = await client.read_frame(skip_heartbeats=False)
                    if frame.frame_type == FRAME_TYPE_MESSAGE:
                        msg = decode_message(frame.data)
                        self.deliveries.record(msg.body, node, trio.current_time())
                        await connection.send(encode_fin(msg.id))
                    elif frame.frame_type == FRAME_TYPE_RESPONSE and frame.data == b"_heartbeat_":
                        await connection.send(encode_nop())
                    elif frame.frame_type == FRAME_TYPE_ERROR:
                        # E_FIN_FAILED: the message timed out and went back, or its node lost it
                        self.errors.append(f"{node}: {frame.data[:200]!r}")
            except DISCONNECTED:
                pass
            finally:
                if self.connections.get(address) is connection:
                    del self.connections[address]
        finally:
            if client is not None:
                with trio.CancelScope(shield=True):
                    await client.aclose()
