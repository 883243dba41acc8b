"""The executor and worker processes of a chaos run: started, SIGKILLed, restarted under
the same name, and every incarnation's life (start, death and its cause) recorded."""

from __future__ import annotations

import random
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from acceptance.helpers import Proc

# Log lines: "2026-01-01T00:00:00.123456Z [info     ] message key=value".
_LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\dT[\d:.]+Z) \[[a-z ]+\] (.*)$")
FAILPOINT = re.compile(r"failpoint (\S+): SIGKILL pid (\d+)")
NAME_HELD = "is held by a live worker process"
NO_DATABASE = "cannot reach the database"


def log_times(path: Path, text: str) -> list[float]:
    """Unix times of the log lines of ``path`` that contain ``text``."""
    found = []
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    for line in lines:
        m = _LOG_LINE.match(line)
        if m and text in m.group(2):
            found.append(datetime.fromisoformat(m.group(1).replace("Z", "+00:00")).timestamp())
    return found


@dataclass
class Incarnation:
    """One process of a member: started at ``started``; ``died`` is when it was killed
    (or, for a process that ended on its own, when the harness saw it gone)."""

    member: str
    number: int
    proc: Proc
    started: float
    failpoints: str = ""
    died: float | None = None
    cause: str | None = None  # sigkill | failpoint <name> | name held | no database | exited <code>

    @property
    def pid(self) -> int:
        return self.proc.pid


@dataclass
class Member:
    """An executor (``e1``) or a worker (``chaos-w1``: its worker name) and its incarnations."""

    role: str
    name: str
    args: list[str]
    env: dict[str, str]
    incarnations: list[Incarnation] = field(default_factory=list)
    restart_at: float | None = None  # a restart is due (monotonic)

    @property
    def current(self) -> Incarnation:
        return self.incarnations[-1]

    @property
    def alive(self) -> bool:
        return bool(self.incarnations) and self.current.died is None and self.current.proc.returncode is None


class Fleet:
    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.members: dict[str, Member] = {}
        self.lock = threading.RLock()
        # failpoint specs still to arm, per member: the next incarnation gets the first.
        self.failpoint_plan: dict[str, list[str]] = {}
        self.arming = True

    def add(self, role: str, name: str, args: list[str], env: Mapping[str, str]) -> Member:
        member = Member(role, name, list(args), dict(env))
        self.members[name] = member
        return member

    def start(self, member: Member) -> Incarnation:
        with self.lock:
            number = len(member.incarnations)
            env = dict(member.env)
            plan = self.failpoint_plan.get(member.name) or []
            spec = plan.pop(0) if plan and self.arming else ""
            if spec:
                env["CONVEYOR_FAILPOINTS"] = spec
            proc = Proc(member.args, env, self.log_dir, f"{member.name}.{number}")
            inc = Incarnation(member.name, number, proc, time.time(), failpoints=spec)
            member.incarnations.append(inc)
            member.restart_at = None
            return inc

    def kill(self, member: Member) -> Incarnation:
        """SIGKILL the member's current process (and its process group)."""
        with self.lock:
            inc = member.current
            inc.proc.kill()
            inc.died = time.time()
            inc.cause = "sigkill"
            return inc

    def reap(self) -> list[Incarnation]:
        """Processes that ended on their own since the last call (failpoints, refusals,
        crashes), with their cause."""
        ended = []
        with self.lock:
            for member in self.members.values():
                if not member.incarnations:
                    continue
                inc = member.current
                code = inc.proc.returncode
                if inc.died is not None or code is None:
                    continue
                inc.died = time.time()
                err = inc.proc.stderr()
                fired = FAILPOINT.search(err)
                if fired:
                    inc.cause = f"failpoint {fired.group(1)}"
                elif NAME_HELD in err:
                    inc.cause = "name held"
                elif NO_DATABASE in err:
                    inc.cause = "no database"
                else:
                    inc.cause = f"exited {code}"
                ended.append(inc)
        return ended

    def schedule_restart(self, member: Member, delay: float) -> None:
        with self.lock:
            member.restart_at = time.monotonic() + delay

    def restart_due(self) -> list[Incarnation]:
        started = []
        with self.lock:
            for member in self.members.values():
                if member.restart_at is not None and time.monotonic() >= member.restart_at and not member.alive:
                    started.append(self.start(member))
        return started

    def dead(self) -> list[Member]:
        with self.lock:
            return [m for m in self.members.values() if not m.alive]

    def pick_victim(self, rng: random.Random, min_alive: Mapping[str, int]) -> Member | None:
        """A random live member whose death leaves at least ``min_alive[role]`` of its role,
        and not one armed with a failpoint: that one is left to crash where it is meant to."""
        with self.lock:
            alive = [m for m in self.members.values() if m.alive]
            count = {role: sum(1 for m in alive if m.role == role) for role in min_alive}
            choices = [m for m in alive if count.get(m.role, 0) > min_alive.get(m.role, 0) and not m.current.failpoints]
            return rng.choice(choices) if choices else None

    def incarnations(self) -> list[Incarnation]:
        with self.lock:
            return [inc for m in self.members.values() for inc in m.incarnations]

    def by_pid(self) -> dict[int, Incarnation]:
        return {inc.pid: inc for inc in self.incarnations()}

    def kill_all(self) -> None:
        with self.lock:
            for inc in self.incarnations():
                inc.proc.kill()
                if inc.died is None:
                    inc.died = time.time()
                    inc.cause = inc.cause or "end of run"

    def tails(self, lines: int = 15) -> str:
        out = []
        for inc in self.incarnations():
            tail = inc.proc.stderr().splitlines()[-lines:]
            out.append(f"--- {inc.member}.{inc.number} (pid {inc.pid}, {inc.cause or 'running'})")
            out.extend(tail)
        return "\n".join(out)
