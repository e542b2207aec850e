"""Network partitions between the nodes of a replicated cluster on one host (Linux, root only).

The nodes run each on a loopback address of its own (``ReplicaCluster(..., own_ips=True)``:
node n on 127.0.0.(n+2)), and dial their peers from it; clients, consumers and nsqlookupd use
127.0.0.1. A :class:`Partition` separates two sets of node addresses, both ways, so the nodes of
one side no longer reach those of the other while every client still reaches every node:

- ``cut``: every TCP packet between the two sides is answered with a reset (iptables
  ``REJECT --reject-with tcp-reset``; resets themselves pass, so that the rejected side sees
  them): connections between the sides break at the next packet, new ones are refused;
- ``blackhole``: every packet between them is dropped (``DROP``): connections fall silent and
  new ones time out;
- ``slow``: every packet between them arrives :data:`SLOW_DELAY` seconds late, each way.
  The packets go to an NFQUEUE queue (``NFQUEUE --queue-bypass``) that this process reads over
  netlink and accepts each packet only once it is due (:class:`_Delayer`). Kernels built
  without ``sch_netem`` (and without ``sch_prio``) cannot delay with ``tc``; NFQUEUE is in
  every kernel with netfilter's queue, and it delays only the packets the rules pick.

Every rule sits in a chain of the partition's own (``PYNSQD-PART-<pid>-<n>``), entered from
``INPUT`` (loopback packets pass it in both directions) by one rule that carries the comment
``pynsqd partition <chain>``. :meth:`Partition.remove` deletes that rule, flushes and deletes
the chain, and releases every packet still held: nothing it did not make is touched, and it
may be called any number of times (a test calls it in a ``finally`` or at its fixture's
teardown). A process killed before it could (SIGKILL, or the SIGTERM of ``timeout``) leaves its
chain behind: the next partition applied on the machine removes the chains of processes that
no longer run (their names hold the pid). :func:`partitions_missing` says why partitions cannot be made here (not root, no
``iptables``, no netfilter, no NFQUEUE), for a test to skip with.
"""

from __future__ import annotations

import errno
import itertools
import os
import re
import select
import shutil
import socket
import struct
import subprocess
import threading
import time
from collections import deque
from collections.abc import Iterable
from typing import Protocol

__all__ = ["KINDS", "SLOW_DELAY", "Partition", "PartitionRefused", "partitions_missing"]

#: What a partition does to the packets between its two sides.
KINDS = ("cut", "blackhole", "slow")
#: Seconds each packet between the sides of a ``slow`` partition is held, each way.
SLOW_DELAY = 3.0
_COMMENT = "pynsqd partition"
_TIMEOUT = 30
_numbers = itertools.count(1)
_OURS = re.compile(r"\bPYNSQD-PART-(\d+)-\d+\b")


class PartitionRefused(RuntimeError):
    """The machine would not make (or undo) a partition's rules; the message says what it answered."""


class _Addressed(Protocol):
    ip: str


def _iptables(*args: str) -> subprocess.CompletedProcess[str]:
    # -w: wait for the xtables lock, which other programs on the machine may hold
    return subprocess.run(["iptables", "-w", "10", *args], capture_output=True, text=True, timeout=_TIMEOUT,
                          check=False)


def _checked(*args: str) -> None:
    done = _iptables(*args)
    if done.returncode != 0:
        raise PartitionRefused(f"iptables {' '.join(args)}: {(done.stderr or done.stdout).strip()}")


def partitions_missing(kind: str = "cut") -> str | None:
    """Why a partition of ``kind`` cannot be made on this machine, or None when it can.

    It makes (and deletes) an empty chain of its own, and for ``slow`` binds a queue."""
    assert kind in KINDS, kind
    if not os.path.exists("/proc/net/netfilter") and not os.path.exists("/proc/sys/net/netfilter"):
        return "network partitions need Linux with netfilter"
    if os.geteuid() != 0:
        return "network partitions need root (iptables)"
    if shutil.which("iptables") is None:
        return "network partitions need iptables (apt-get install iptables)"
    chain = _chain_name()
    made = _iptables("-N", chain)
    if made.returncode != 0:
        return f"iptables cannot make a chain here: {(made.stderr or made.stdout).strip()}"
    _iptables("-X", chain)
    if kind == "slow":
        try:
            _Delayer(SLOW_DELAY).close()
        except OSError as exc:
            return f"slow partitions need netfilter's NFQUEUE (nfnetlink_queue): {exc}"
    return None


def _chain_name() -> str:
    return f"PYNSQD-PART-{os.getpid()}-{next(_numbers)}"  # at most 28 characters, as iptables allows


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_orphans() -> None:
    """Remove the chains (and their jump rules) that partitions of processes no longer running left."""
    listed = _iptables("-S")
    if listed.returncode != 0:
        return
    orphans = {match.group(0) for match in _OURS.finditer(listed.stdout) if not _running(int(match.group(1)))}
    for chain in sorted(orphans):
        _iptables("-D", "INPUT", "-m", "comment", "--comment", f"{_COMMENT} {chain}", "-j", chain)
        _iptables("-F", chain)
        _iptables("-X", chain)


class Partition:
    """A partition of ``kind`` (:data:`KINDS`) between the nodes (or addresses) ``side`` and
    ``other``; nothing happens until :meth:`apply`, and :meth:`remove` undoes it all."""

    def __init__(self, kind: str, side: Iterable[_Addressed | str], other: Iterable[_Addressed | str]):
        assert kind in KINDS, f"unknown partition kind {kind!r}"
        self.kind = kind
        self.side = [_ip(node) for node in side]
        self.other = [_ip(node) for node in other]
        assert self.side and self.other and not set(self.side) & set(self.other), (self.side, self.other)
        self.chain = _chain_name()
        self._made_chain = False
        self._jump: list[str] | None = None
        self._delayer: _Delayer | None = None
        #: when it was applied and removed (``time.monotonic``), None before
        self.applied_at: float | None = None
        self.removed_at: float | None = None

    def __repr__(self) -> str:
        return f"Partition({self.kind}: {','.join(self.side)} | {','.join(self.other)})"

    @property
    def active(self) -> bool:
        return self.applied_at is not None and self.removed_at is None

    def apply(self) -> Partition:
        """Make the rules (raises :class:`PartitionRefused`, having removed what it made, when
        the machine refuses)."""
        assert self.applied_at is None, "a partition is applied once"
        _remove_orphans()
        try:
            if self.kind == "slow":
                self._delayer = _Delayer(SLOW_DELAY)
                self._delayer.start()
            _checked("-N", self.chain)
            self._made_chain = True
            for source, destination in self._pairs():
                _checked("-A", self.chain, "-s", source, "-d", destination, *self._target())
            jump = ["INPUT", "-m", "comment", "--comment", f"{_COMMENT} {self.chain}", "-j", self.chain]
            _checked("-I", jump[0], "1", *jump[1:])
            self._jump = jump
        except BaseException:
            self.remove()
            raise
        self.applied_at = time.monotonic()
        return self

    def remove(self) -> None:
        """Undo everything :meth:`apply` made (what it had made, when it failed half-way); raises
        :class:`PartitionRefused` naming what is left when iptables refuses to delete it."""
        problems = []
        if self._jump is not None:
            done = _iptables("-D", *self._jump)
            if done.returncode == 0:
                self._jump = None
            else:
                problems.append(f"the rule {' '.join(self._jump)}: {done.stderr.strip()}")
        if self._made_chain and self._jump is None:
            flushed, deleted = _iptables("-F", self.chain), _iptables("-X", self.chain)
            if deleted.returncode == 0:
                self._made_chain = False
            else:
                problems.append(f"the chain {self.chain}: {(flushed.stderr + deleted.stderr).strip()}")
        if self._delayer is not None:
            self._delayer.close()  # after the rules: no packet comes to it any more; those held pass now
            self._delayer = None
        if self.applied_at is not None and self.removed_at is None:
            self.removed_at = time.monotonic()
        if problems:
            raise PartitionRefused("could not remove " + "; ".join(problems))

    def __enter__(self) -> Partition:
        return self.apply()

    def __exit__(self, *exc_info: object) -> None:
        self.remove()

    def _pairs(self) -> list[tuple[str, str]]:
        """(source, destination) of the packets it stops: both ways between the sides."""
        return [pair for a in self.side for b in self.other for pair in ((a, b), (b, a))]

    def _target(self) -> list[str]:
        if self.kind == "cut":
            return ["-p", "tcp", "!", "--tcp-flags", "RST", "RST", "-j", "REJECT", "--reject-with", "tcp-reset"]
        if self.kind == "blackhole":
            return ["-j", "DROP"]
        assert self._delayer is not None
        return ["-j", "NFQUEUE", "--queue-num", str(self._delayer.queue), "--queue-bypass"]


def _ip(node: _Addressed | str) -> str:
    return node if isinstance(node, str) else node.ip


# ---------------------------------------------------------------- slow: NFQUEUE over netlink

_NETLINK_NETFILTER = 12
_NFNL_SUBSYS_QUEUE = 3
_MSG_PACKET, _MSG_VERDICT, _MSG_CONFIG, _MSG_VERDICT_BATCH = 0, 1, 2, 3
_CFG_CMD, _CFG_PARAMS, _CFG_QUEUE_MAXLEN, _CFG_MASK, _CFG_FLAGS = 1, 2, 3, 4, 5
_CMD_BIND, _CMD_UNBIND = 1, 2
_COPY_META = 1
_F_FAIL_OPEN = 1  # a full queue lets packets through rather than dropping them
_PACKET_HDR, _VERDICT_HDR = 1, 2
_NF_ACCEPT = 1
_NLM_F_REQUEST, _NLM_F_ACK = 1, 4
_NLMSG_ERROR = 2
_QUEUE_LENGTH = 20000


def _attribute(kind: int, payload: bytes) -> bytes:
    length = 4 + len(payload)
    return struct.pack("=HH", length, kind) + payload + b"\0" * (-length % 4)


def _message(kind: int, queue: int, attributes: Iterable[bytes], flags: int = _NLM_F_REQUEST, seq: int = 0) -> bytes:
    body = struct.pack("=BB", socket.AF_UNSPEC, 0) + struct.pack("!H", queue) + b"".join(attributes)
    return struct.pack("=IHHII", 16 + len(body), (_NFNL_SUBSYS_QUEUE << 8) | kind, flags, seq, 0) + body


def _messages(data: bytes) -> Iterable[tuple[int, bytes]]:
    """(type, payload) of each netlink message in ``data``."""
    offset = 0
    while offset + 16 <= len(data):
        length, kind = struct.unpack_from("=IH", data, offset)
        if length < 16:
            return
        yield kind, data[offset + 16:offset + length]
        offset += (length + 3) & ~3


def _attributes(data: bytes) -> dict[int, bytes]:
    found = {}
    offset = 0
    while offset + 4 <= len(data):
        length, kind = struct.unpack_from("=HH", data, offset)
        if length < 4:
            break
        found[kind & 0x3FFF] = data[offset + 4:offset + length]
        offset += (length + 3) & ~3
    return found


class _Delayer:
    """Binds a free NFQUEUE queue and accepts each packet queued to it ``delay`` seconds after it
    came, in a thread of its own; :meth:`close` lets every packet still held through and unbinds."""

    def __init__(self, delay: float):
        self.delay = delay
        self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_NETFILTER)
        try:
            self._sock.bind((0, 0))
            try:  # many packets may be held at once: room for all their notices
                self._sock.setsockopt(socket.SOL_SOCKET, 33, 16 << 20)  # SO_RCVBUFFORCE (root)
            except OSError:
                self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 20)
            self._seq = 0
            self.queue = self._bind()
        except BaseException:
            self._sock.close()
            raise
        #: (due, packet id), in the order the packets came; ids grow, and all wait as long
        self._held: deque[tuple[float, int]] = deque()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"partition-delay-{self.queue}", daemon=True)
        self.packets = 0

    def _request(self, queue: int, attributes: list[bytes]) -> None:
        """A config request for ``queue``, answered by the kernel's acknowledgement (raises OSError
        with the kernel's error)."""
        self._seq += 1
        self._sock.send(_message(_MSG_CONFIG, queue, attributes, _NLM_F_REQUEST | _NLM_F_ACK, self._seq))
        self._sock.settimeout(5)
        while True:
            for kind, payload in _messages(self._sock.recv(65536)):
                if kind == _NLMSG_ERROR:
                    (error,) = struct.unpack_from("=i", payload)
                    if error:
                        raise OSError(-error, os.strerror(-error))
                    return

    def _bind(self) -> int:
        """Bind a queue no other program reads (one bound elsewhere answers EBUSY)."""
        last: OSError | None = None
        for queue in itertools.islice(itertools.count(30000 + os.getpid() % 20000, 7), 64):
            try:
                self._request(queue, [_attribute(_CFG_CMD, struct.pack("!BBH", _CMD_BIND, 0, socket.AF_INET))])
            except OSError as exc:
                last = exc
                continue
            self._request(queue, [_attribute(_CFG_PARAMS, struct.pack("!IB", 0, _COPY_META)),
                           _attribute(_CFG_QUEUE_MAXLEN, struct.pack("!I", _QUEUE_LENGTH)),
                           _attribute(_CFG_MASK, struct.pack("!I", _F_FAIL_OPEN)),
                           _attribute(_CFG_FLAGS, struct.pack("!I", _F_FAIL_OPEN))])
            return queue
        raise last or OSError("no NFQUEUE queue could be bound")

    def start(self) -> None:
        self._sock.setblocking(False)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            wait = 0.05
            if self._held:
                wait = min(wait, max(0.0, self._held[0][0] - time.monotonic()))
            readable, _, _ = select.select([self._sock], [], [], wait)
            if readable:
                self._read()
            self._release(time.monotonic())

    def _read(self) -> None:
        while True:
            try:
                data = self._sock.recv(1 << 20)
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno == errno.ENOBUFS:  # notices were lost: the next batch verdict covers their ids
                    continue
                return
            now = time.monotonic()
            for kind, payload in _messages(data):
                if kind != (_NFNL_SUBSYS_QUEUE << 8) | _MSG_PACKET:
                    continue
                header = _attributes(payload[4:]).get(_PACKET_HDR)
                if header is not None:
                    self._held.append((now + self.delay, struct.unpack_from("!I", header)[0]))
                    self.packets += 1

    def _release(self, now: float) -> None:
        """Accept every packet due: one batch verdict, for the latest id due, accepts all before it."""
        last = None
        while self._held and self._held[0][0] <= now:
            last = self._held.popleft()[1]
        if last is not None:
            self._verdict(last)

    def _verdict(self, packet_id: int) -> None:
        header = _attribute(_VERDICT_HDR, struct.pack("!II", _NF_ACCEPT, packet_id))
        try:
            self._sock.send(_message(_MSG_VERDICT_BATCH, self.queue, [header]))
        except OSError:
            pass  # the packet is gone (its queue was flushed): nothing to let through

    def close(self) -> None:
        if self._thread.is_alive():
            self._stop.set()
            self._thread.join(10)
        if self._held:
            self._verdict(self._held[-1][1])
            self._held.clear()
        try:
            self._sock.setblocking(True)
            self._request(self.queue, [_attribute(_CFG_CMD, struct.pack("!BBH", _CMD_UNBIND, 0, socket.AF_INET))])
        except OSError:
            pass  # closing the socket unbinds it too
        finally:
            self._sock.close()
