"""Network faults for acceptance tests and benchmarks (stdlib only, so ``bench/`` can load
this file by path).

- :class:`VethNamespace`: a network namespace joined to the root namespace by a veth
  pair on a private /30 inside 10.231.0.0/16. A process started under
  :meth:`VethNamespace.command` lives in the namespace; :meth:`cut` sets the root-side
  end down (a real partition: packets are dropped, nothing is closed or reset) and
  :meth:`restore` brings it back.
- :class:`Forwarder`: a TCP forwarder in the root namespace, listening on the veth's
  root-side address and forwarding to PostgreSQL (which listens on loopback only).
  The forwarder stands where the server would be, so it applies to each accepted
  connection the keepalives and user timeout that the server applies to a worker's
  liveness session (:func:`liveness_keepalive`): a peer gone behind a partition is
  dropped after about the worker's staleness bound, and with it the upstream session
  (and any advisory lock it holds), as the server itself would do.

Needs root and a working ``ip netns``: :func:`netns_problem` says why not.
"""

from __future__ import annotations

import contextlib
import ipaddress
import itertools
import math
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

SUBNET = ipaddress.ip_network("10.231.0.0/16")
_serial = itertools.count()


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
    if check and result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
    return result


def netns_problem() -> str | None:
    """Why network namespaces cannot be used here; None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    probe = f"cvprobe{os.getpid()}"
    try:
        _ip("netns", "add", probe)
        try:
            _ip("netns", "exec", probe, "ip", "link", "set", "lo", "up")
            _ip("link", "add", f"{probe}a", "type", "veth", "peer", "name", f"{probe}b", "netns", probe)
            _ip("link", "del", f"{probe}a")
        finally:
            _ip("netns", "del", probe, check=False)
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        return f"`ip netns` is unusable here: {exc}"
    return None


def _addresses_in_use() -> set[ipaddress.IPv4Address]:
    out = _ip("-o", "-4", "addr", "show").stdout
    found = set()
    for line in out.splitlines():
        fields = line.split()
        if "inet" in fields:
            found.add(ipaddress.ip_interface(fields[fields.index("inet") + 1]).ip)
    return found


class VethNamespace:
    """A namespace ``cvns<pid><n>`` reaching the root namespace over a veth pair."""

    def __init__(self) -> None:
        tag = f"{os.getpid() % 1000000}x{next(_serial)}"
        self.ns = f"cvns{tag}"
        self.host_if = f"cvh{tag}"  # root-namespace end
        self.ns_if = f"cvn{tag}"  # namespace end
        used = _addresses_in_use()
        subnets = list(SUBNET.subnets(new_prefix=30))
        start = os.getpid() % len(subnets)
        for i in range(len(subnets)):
            net = subnets[(start + i) % len(subnets)]
            host, peer = list(net.hosts())
            if host not in used and peer not in used:
                break
        else:
            raise RuntimeError(f"no free /30 in {SUBNET}")
        self.network = net
        self.host_addr = str(host)
        self.ns_addr = str(peer)
        self._created = False

    def create(self) -> VethNamespace:
        _ip("netns", "add", self.ns)
        self._created = True
        _ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if, "netns", self.ns)
        _ip("addr", "add", f"{self.host_addr}/30", "dev", self.host_if)
        _ip("link", "set", self.host_if, "up")
        self.run("ip", "link", "set", "lo", "up")
        self.run("ip", "addr", "add", f"{self.ns_addr}/30", "dev", self.ns_if)
        self.run("ip", "link", "set", self.ns_if, "up")
        return self

    def command(self, *argv: str) -> list[str]:
        """``argv`` run inside the namespace (``ip netns exec`` execs it: same pid)."""
        return ["ip", "netns", "exec", self.ns, *argv]

    def run(self, *argv: str) -> None:
        _ip("netns", "exec", self.ns, *argv)

    def cut(self) -> None:
        """Partition: the root-side end goes down; both sides' packets are dropped."""
        _ip("link", "set", self.host_if, "down")

    def restore(self) -> None:
        _ip("link", "set", self.host_if, "up")

    def close(self) -> None:
        """Remove the pair and the namespace (kill the processes in it first)."""
        if not self._created:
            return
        _ip("link", "del", self.host_if, check=False)
        _ip("netns", "del", self.ns, check=False)
        self._created = False

    def __enter__(self) -> VethNamespace:
        return self.create()

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class Keepalive:
    idle: int
    interval: int
    count: int
    user_timeout_ms: int


def liveness_keepalive(heartbeat_interval: float, multiplier: float = 3.0) -> Keepalive:
    """What a worker's liveness connection asks of both ends (the same arithmetic as
    ``conveyor.worker.liveness.Liveness._connect``): dead peer dropped after about
    heartbeat_interval x multiplier."""
    bound = heartbeat_interval * multiplier
    idle = max(1, math.floor(heartbeat_interval))
    interval = max(1, math.floor(idle / 2))
    count = max(1, math.ceil((bound - idle) / interval))
    return Keepalive(idle, interval, count, int(bound * 1000))


class Forwarder:
    """Forward TCP connections from ``listen`` to ``target`` with one thread per direction.

    When either side ends or fails (including a keepalive or user timeout on the
    accepted side), both sockets are closed, so the server ends the session.

    ``inspect(peer, side, data)``, if given, sees every chunk (``side`` is "client" or
    "server") before it is forwarded; a number returned drops that connection: the chunk
    still goes through, nothing more comes back to the client, and both sockets close
    that many seconds later (a server that did the work, and an answer lost on the way).

    While ``closing`` is set, new connections are accepted and closed at once (a client
    that cannot get through, while established ones carry on).
    """

    def __init__(
        self,
        listen_host: str,
        target: tuple[str, int],
        keepalive: Keepalive | None = None,
        inspect: Callable[[str, str, bytes], float | None] | None = None,
    ) -> None:
        self._target = target
        self._keepalive = keepalive
        self._inspect = inspect
        self._server = socket.create_server((listen_host, 0))
        self._server.settimeout(0.2)
        self.address: tuple[str, int] = self._server.getsockname()[:2]
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._pairs: list[_Pair] = []
        self.accepted = 0
        self.dropped = 0  # connections ended by an error on the accepted side (e.g. a keepalive timeout)
        self.events: list[str] = []  # why each forwarded connection ended (for failure messages)
        self.closing = threading.Event()
        self._thread = threading.Thread(target=self._accept_loop, name="forwarder-accept", daemon=True)

    @property
    def host(self) -> str:
        return self.address[0]

    @property
    def port(self) -> int:
        return self.address[1]

    def start(self) -> Forwarder:
        self._thread.start()
        return self

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                down, peer = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._stop.is_set():
                    return
                continue
            if self.closing.is_set():
                down.close()
                continue
            try:
                up = socket.create_connection(self._target, timeout=5)
            except OSError:
                down.close()
                continue
            up.settimeout(None)
            down.settimeout(None)
            self._tune(down)
            pair = _Pair(down, up, f"{peer[0]}:{peer[1]}")
            with self._lock:
                self._pairs.append(pair)
                self.accepted += 1
            for client_side in (True, False):
                threading.Thread(target=self._pump, args=(pair, client_side), daemon=True).start()

    def _tune(self, sock: socket.socket) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        k = self._keepalive
        if k is None:
            return
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, k.idle)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, k.interval)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, k.count)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, k.user_timeout_ms)

    def _pump(self, pair: _Pair, client_side: bool) -> None:
        side = "client" if client_side else "server"
        src, dst = (pair.down, pair.up) if client_side else (pair.up, pair.down)
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    self._event(pair, f"{side} closed")
                    break
                drop_after = self._inspect(pair.peer, side, data) if self._inspect else None
                if drop_after is not None:
                    pair.muted.set()  # nothing more reaches the client
                    if not client_side:
                        data = b""
                elif pair.muted.is_set() and not client_side:
                    continue
                dst.sendall(data)
                if drop_after is not None:
                    time.sleep(drop_after)
                    self._event(pair, f"dropped after {side} data, as the test asked")
                    break
        except OSError as exc:
            self._event(pair, f"{side} side failed: {exc!r}")
            if client_side and not self._stop.is_set():
                with self._lock:
                    self.dropped += 1
        finally:
            self._close_pair(pair)

    def _event(self, pair: _Pair, what: str) -> None:
        stamp = time.strftime("%H:%M:%S", time.gmtime()) + f".{int(time.time() * 1000) % 1000:03d}Z"
        with self._lock:
            self.events.append(f"{stamp} {pair.peer}: {what}")

    def _close_pair(self, pair: _Pair) -> None:
        with self._lock:
            if pair not in self._pairs:
                return
            self._pairs.remove(pair)
        for sock in (pair.down, pair.up):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def close(self) -> None:
        self._stop.set()
        self._server.close()
        with self._lock:
            pairs = list(self._pairs)
        for pair in pairs:
            self._close_pair(pair)
        self._thread.join(timeout=5)

    def __enter__(self) -> Forwarder:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(eq=False)
class _Pair:
    down: socket.socket  # accepted: the client's side
    up: socket.socket  # to the server
    peer: str
    muted: threading.Event = field(default_factory=threading.Event)
