"""Acceptance (issue #25): user data holding terminal escape sequences is shown, not
obeyed, by every command that prints it on a terminal. Each command runs on a real
pseudo-terminal (TERM=dumb, so Rich itself writes no colour codes): not one ESC byte may
reach it, and the data must be there, escaped (``\\x1b[2J``). Piped, ``--json`` and the
other commands' output are unchanged (test_cli_input.py)."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import termios
import time
from pathlib import Path

import pytest

from acceptance.helpers import CONVEYOR, Procs, conveyor_env, describe, eventually

pytestmark = pytest.mark.acceptance

# Clears the screen, sets the window title, then a marker: what a hostile prompt could hold.
INJECTED = "\x1b[2J\x1b]0;pwned\x07X"
YAML_INJECTED = "\\e[2J\\e]0;pwned\\aX"  # the same, as a YAML double-quoted string spells it
SHOWN = ("\\x1b[2J", "\\u001b[2J")  # as text escaped for a terminal, or in JSON shown in a cell


@pytest.fixture
def env(db_url: str) -> dict[str, str]:
    return conveyor_env(db_url, CONVEYOR_USER="alice")


def on_terminal(env: dict[str, str], *args: str, timeout: float = 60.0) -> str:
    """The output of ``conveyor ARGS`` with stdout and stderr on a pseudo-terminal."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 60, 400, 0, 0))  # wide: no cell is cut
    proc = subprocess.Popen([*CONVEYOR, *args], stdin=subprocess.DEVNULL, stdout=slave, stderr=slave,
                            env={**env, "TERM": "dumb", "NO_COLOR": "1"})  # fmt: skip
    os.close(slave)
    out = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the last writer closed the terminal
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(master)
        proc.wait(timeout=10)
    assert proc.returncode == 0, (args, out.decode(errors="replace"))
    return out.decode(errors="replace")


def seed(procs: Procs, tmp_path: Path) -> dict[str, str]:
    """The same hostile text in every kind of user data a command prints."""
    run = procs.run
    assert run("triggers", "register", "t.esc", "--description", INJECTED).returncode == 0
    assert run("events", "emit", "t.esc", f"m={INJECTED}").returncode == 0
    rule = tmp_path / "rule.yaml"
    rule.write_text(f'ref: t.rule\ntrigger: t.esc\ndescription: "{YAML_INJECTED}"\naction:\n  ref: core.echo\n'
                    f'  parameters:\n    message: "{YAML_INJECTED}"\n')  # fmt: skip
    assert run("rules", "register", str(rule)).returncode == 0, describe(run("rules", "register", str(rule)))
    workflow = tmp_path / "workflow.yaml"
    workflow.write_text(f'ref: t.flow\nversion: 1.0\ndescription: "{YAML_INJECTED}"\ntasks:\n'
                        f'  a:\n    action: core.echo\n    input:\n      message: "{YAML_INJECTED}"\n')  # fmt: skip
    result = run("workflows", "register", str(workflow))
    assert result.returncode == 0, describe(result)
    result = run("schedules", "create", "s", "core.echo", f"message={INJECTED}", "--interval", "1h",
                 "--description", INJECTED)  # fmt: skip
    assert result.returncode == 0, describe(result)
    result = run("webhooks", "create", "hook", "--trigger", "t.hook", "--no-auth", "--description", INJECTED)
    assert result.returncode == 0, describe(result)
    procs.start("executor", name="executor")
    procs.start("worker", "--name", "w-esc", name="worker").wait_for_log("worker registered")
    echoed = procs.json("run", "core.echo", f"message={INJECTED}", "--wait", "--json")
    procs.start("run", "core.ask", f"prompt={INJECTED}", name="ask")
    inquiry = eventually(lambda: (procs.json("inquiries", "list") or [None])[0], 30, interval=0.2, message=procs.logs)
    answered = procs.run("inquiries", "respond", str(inquiry["id"]), "--data", f'{{"r": "{INJECTED}"}}'.replace(
        "\x1b", "\\u001b").replace("\x07", "\\u0007"))  # fmt: skip
    assert answered.returncode == 0, describe(answered)
    return {"execution": str(echoed["id"]), "inquiry": str(inquiry["id"])}


def test_no_command_lets_user_data_drive_the_terminal(procs: Procs, tmp_path: Path) -> None:
    ids = seed(procs, tmp_path)
    # Commands that show a field holding the hostile text (it must be there, escaped) ...
    showing = [
        ("triggers", "list"), ("triggers", "get", "t.esc"),
        ("events", "list"), ("events", "get", "1"),
        ("rules", "get", "t.rule"),
        ("workflows", "list"), ("workflows", "get", "t.flow"),
        ("schedules", "get", "s"),
        ("webhooks", "get", "hook"),
        ("executions", "get", ids["execution"]),
        ("inquiries", "list", "--status", "all"), ("inquiries", "get", ids["inquiry"]),
    ]  # fmt: skip
    # ... and listings of the same objects whose columns hold names and states only.
    others = [("rules", "list"), ("schedules", "list"), ("webhooks", "list"), ("executions", "list"),
              ("enforcements", "list"), ("workers", "list"), ("workflows", "get", "t.flow", "--source")]  # fmt: skip
    outputs = {args: on_terminal(procs.env, *args) for args in showing + others}
    raw = [args for args, out in outputs.items() if "\x1b" in out]
    assert raw == [], f"raw ESC printed by: {raw}"
    hidden = [args for args in showing if not any(s in outputs[args] for s in SHOWN)]
    assert hidden == [], f"the data is not shown (escaped) by: {hidden}"
