"""Acceptance: ``conveyor run`` as a user meets it, against ``conveyor up`` and a real
PostgreSQL. ``--params-file`` from a file and from standard input; ``--wait`` shows the
execution's progress on a terminal (run under pseudo-terminals) and nothing more than its
result when piped or asked for JSON."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import socket
import struct
import subprocess
import termios
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from acceptance.helpers import CONVEYOR, Procs, conveyor_env, describe

pytestmark = pytest.mark.acceptance

# Escape sequences (colours, cursor moves, erasing the spinner's line) are dropped, and
# carriage returns made line ends, before the text is compared.
_ESCAPES = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[()][0-9A-Za-z]")


@pytest.fixture
def env(db_url: str) -> dict[str, str]:
    return conveyor_env(db_url, TERM="xterm-256color")


def up(procs: Procs) -> str:
    """``conveyor up`` (migrations, executor and a worker); the worker's name."""
    proc = procs.start("up", name="up")
    proc.wait_for_log("Conveyor is up")
    return f"{socket.gethostname()}-{proc.pid}"


def plain_lines(raw: bytes) -> list[str]:
    text = _ESCAPES.sub("", raw.decode(errors="replace"))
    return [part.rstrip() for part in re.split(r"[\r\n]+", text) if part.strip()]


def run_on_terminals(*args: str, env: Mapping[str, str], timeout: float = 60.0) -> tuple[int, bytes, bytes]:
    """Run ``conveyor ARGS`` with its stdout and its stderr each on a pseudo-terminal of
    its own (one terminal in real life; two keep them apart here): exit code, and what was
    written to each, escape sequences included."""
    masters, slaves = [], []
    for _ in range(2):
        master, slave = pty.openpty()
        # 40 rows x 160 columns: the default 0x0 would leave the width to Rich's guess.
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
        masters.append(master)
        slaves.append(slave)
    try:
        proc = subprocess.Popen(
            [*CONVEYOR, *args], env=dict(env), stdin=subprocess.DEVNULL, stdout=slaves[0], stderr=slaves[1]
        )
    finally:
        for slave in slaves:
            os.close(slave)
    written = {fd: bytearray() for fd in masters}
    reading = set(masters)
    deadline = time.monotonic() + timeout
    try:
        # Read both as the command writes (a full terminal buffer would block it) until
        # both are closed: on Linux a master reads EIO once no process holds its slave.
        while reading:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                proc.kill()
                raise AssertionError(
                    f"conveyor {' '.join(args)} still running after {timeout:g}s\n"
                    f"stdout: {bytes(written[masters[0]])!r}\nstderr: {bytes(written[masters[1]])!r}"
                )
            ready, _, _ = select.select(list(reading), [], [], min(remaining, 1.0))
            for fd in ready:
                try:
                    data = os.read(fd, 65536)
                except OSError:
                    data = b""
                if data:
                    written[fd] += data
                else:
                    reading.discard(fd)
        code = proc.wait(10)
    finally:
        for master in masters:
            os.close(master)
    return code, bytes(written[masters[0]]), bytes(written[masters[1]])


# -- --params-file ---------------------------------------------------------------------


def run_with_stdin(env: Mapping[str, str], stdin: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CONVEYOR, *args], env=dict(env), input=stdin, capture_output=True, text=True, timeout=60, check=False
    )


def test_params_file_from_a_file_and_from_standard_input(procs: Procs, tmp_path: Path) -> None:
    up(procs)
    # Larger than one argument may be (128 KiB on Linux), with quotes a shell would mangle.
    message = 'it\'s "quoted" $HOME `x` [b]y[/b]\n' * 10_000
    params = tmp_path / "params.json"
    params.write_text(json.dumps({"message": message}))
    waited = procs.run("run", "core.echo", "--params-file", str(params), "--wait", "--json")
    assert waited.returncode == 0, describe(waited)
    execution = json.loads(waited.stdout)
    assert execution["status"] == "completed"
    assert execution["parameters"] == {"message": message}

    piped = run_with_stdin(procs.env, '{"message": "from stdin"}', "run", "core.echo", "--params-file", "-")
    assert piped.returncode == 0, piped
    overridden = run_with_stdin(
        procs.env, '{"message": "from stdin"}', "run", "core.echo", "--params-file", "-", "message=from argv"
    )
    assert overridden.returncode == 0, overridden
    for result, expected in [(piped, "from stdin"), (overridden, "from argv")]:
        got = procs.json("executions", "get", result.stdout.strip())
        assert got["parameters"] == {"message": expected}


BAD_FILES = [
    ('{"message": "x",\n "other": }', "--params-file standard input: not JSON: Expecting value at line 2 column 11"),
    ('["message"]', "--params-file standard input: expected a JSON object of parameters"),
    ('{"message": NaN}', "NaN is not a number JSON can carry"),
    ('{"message": 5}', "invalid parameters for core.echo"),  # validated as key=value ones are
]


def test_bad_params_files_are_one_line_and_request_nothing(procs: Procs) -> None:
    up(procs)  # once: starting it is most of the test's time
    for content, error in BAD_FILES:
        result = run_with_stdin(procs.env, content, "run", "core.echo", "--params-file", "-")
        assert result.returncode == 1, result
        assert result.stderr.startswith("error: "), result
        assert result.stderr.count("\n") == 1, result
        assert error in result.stderr, result
    missing = procs.run("run", "core.echo", "--params-file", "/nonexistent/params.json")
    assert missing.returncode == 1, describe(missing)
    assert missing.stderr == "error: --params-file /nonexistent/params.json: no such file\n", describe(missing)
    assert procs.json("executions", "list") == []


# -- --wait: progress on a terminal only ----------------------------------------------


def test_wait_on_a_terminal_shows_progress_on_stderr(procs: Procs) -> None:
    worker = up(procs)
    code, out, err = run_on_terminals("run", "core.sleep", "seconds=2", "--wait", env=procs.env)
    stdout, stderr = plain_lines(out), plain_lines(err)
    report = f"exit code {code}\n--- stdout ---\n{out!r}\n--- stderr ---\n{err!r}"
    assert code == 0, report
    # stdout: the result, as when piped; the progress went to stderr.
    found = re.fullmatch(r"execution (\d+)  core\.sleep  completed  attempt 1", stdout[0])
    assert found, report
    assert not any("waiting for" in text or text.endswith(f"on {worker}") for text in stdout), report
    execution_id = found.group(1)
    # A line per status, each with the attempt and the worker once one has it (a status
    # that lasts less than a read apart, e.g. requested or scheduled, may be missed), ...
    statuses = [m.group(1) for text in stderr if (m := re.fullmatch(r"\s*\d+\.\ds  (\w+)(?:  .*)?", text))]
    assert statuses[-2:] == ["running", "completed"], report
    assert any(re.fullmatch(rf"\s*\d+\.\ds  running  attempt 1  on {re.escape(worker)}", t) for t in stderr), report
    assert any(re.fullmatch(rf"\s*\d+\.\ds  completed  attempt 1  on {re.escape(worker)}", t) for t in stderr), report
    # ... and a spinner saying what it waits for while it waits.
    assert any(f"waiting for execution {execution_id} core.sleep: running" in text for text in stderr), report


def test_wait_piped_or_as_json_shows_no_progress(procs: Procs) -> None:
    up(procs)
    piped = procs.run("run", "core.sleep", "seconds=0.5", "--wait")
    assert piped.returncode == 0, describe(piped)
    assert piped.stderr == "", describe(piped)
    assert re.match(r"execution \d+  core\.sleep  completed  attempt 1\n", piped.stdout), describe(piped)

    # On a terminal, --json is for a program: the JSON alone, nothing on stderr.
    code, out, err = run_on_terminals("run", "core.sleep", "seconds=0.5", "--wait", "--json", env=procs.env)
    assert code == 0, (out, err)
    assert err == b"", (out, err)
    assert json.loads(out.decode())["status"] == "completed"
