"""Acceptance: the issue's billion-laughs workflow sent to a real ``conveyor api`` process
(issue #25, point 1). Before: 201, the definition stored as 39 MB, the process grew by
hundreds of MB and ``/health/live`` stopped answering for seconds. Now: 422 naming the
bound, and while it is answered ``/health/live`` keeps answering and the process does not
grow. The figures are printed.

A written-out document has no alias to refuse early: a 2 MB list of a million values, posted
as a workflow's YAML, took 50 s (21 s of CPU) to be refused, pinning a worker thread. Now
libyaml parses it, off the event loop: with ``documents.max_nodes`` at 100,000 (what
docs/configuration.md suggests where definitions come from untrusted hands) it is refused in
about a second, while /health/live keeps answering."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest

from acceptance.helpers import Procs, conveyor_env
from acceptance.test_api_cli import create_token, free_port
from support.documents import bomb, written_out

pytestmark = pytest.mark.acceptance


@pytest.fixture
def env(db_url: str) -> dict[str, str]:
    return conveyor_env(db_url)


def peak_rss_mib(pid: int) -> float:
    """The process's high-water mark of resident memory (VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def test_the_bomb_is_refused_while_the_api_keeps_answering(procs: Procs) -> None:
    port = free_port()
    api = procs.start("api", name="api", env={**procs.env, "CONVEYOR__API__PORT": str(port)})
    api.wait_for_log("API listening", timeout=30)
    base, pid = f"http://127.0.0.1:{port}", api.pid
    token = create_token(procs, "operator")
    with httpx.Client(base_url=base, timeout=60) as client:
        assert client.get("/health/live").status_code == 200
        before = peak_rss_mib(pid)
        gaps: list[float] = []
        stop = threading.Event()

        def probe() -> None:
            with httpx.Client(base_url=base, timeout=60) as prober:
                while not stop.is_set():
                    started = time.perf_counter()
                    assert prober.get("/health/live").status_code == 200
                    gaps.append(time.perf_counter() - started)
                    time.sleep(0.02)

        prober = threading.Thread(target=probe)
        prober.start()
        try:
            started = time.perf_counter()
            response = client.post("/api/v1/workflows", json={"source": bomb()},
                                   headers={"Authorization": f"Bearer {token}"})  # fmt: skip
            took = time.perf_counter() - started
            time.sleep(0.3)  # a few probes after the answer too
        finally:
            stop.set()
            prober.join(60)
        after = peak_rss_mib(pid)
    print(f"\nconveyor api, 7-level bomb ({len(bomb())} bytes): {response.status_code} in {took * 1000:.0f} ms; "
          f"slowest /health/live {max(gaps) * 1000:.0f} ms over {len(gaps)} probes; "
          f"peak RSS {before:.0f} -> {after:.0f} MiB")  # fmt: skip
    assert response.status_code == 422, response.text
    assert "documents.max_nodes" in response.text
    assert max(gaps) < 3.0  # a stall, not a slow probe on a loaded machine (1.1 s seen in CI; the stall was 6.6 s)
    assert after - before < 50


def test_a_large_written_out_document_is_refused_while_the_api_answers(procs: Procs) -> None:
    port = free_port()
    env = {**procs.env, "CONVEYOR__API__PORT": str(port), "CONVEYOR__DOCUMENTS__MAX_NODES": "100000"}
    api = procs.start("api", name="api", env=env)
    api.wait_for_log("API listening", timeout=30)
    base = f"http://127.0.0.1:{port}"
    auth = {"Authorization": f"Bearer {create_token(procs, 'operator')}"}
    # YAML: 500,000 values (1 MB, under the 1 MiB a definition or a rule may have); JSON:
    # a million (2 MB, under api.max_body_bytes, 10 MiB).
    text = written_out(500_000)
    posts = {"workflow YAML": ("/api/v1/workflows", {"json": {"source": f"ref: tests.big\nvars:\n  - big: {text}\n"}}),
             "rule YAML": ("/api/v1/rules", {"content": f"ref: tests.big\ntrigger: t\ncriteria: {{x: {text}}}\n"}),
             "JSON body": ("/api/v1/workflows", {"json": {"definition": {"vars": [[1] * 1_000_000]}}})}  # fmt: skip
    gaps: list[float] = []
    stop = threading.Event()

    def probe() -> None:
        with httpx.Client(base_url=base, timeout=60) as prober:
            while not stop.is_set():
                started = time.perf_counter()
                assert prober.get("/health/live").status_code == 200
                gaps.append(time.perf_counter() - started)
                time.sleep(0.02)

    took: dict[str, float] = {}
    with httpx.Client(base_url=base, timeout=120) as client:
        prober = threading.Thread(target=probe)
        prober.start()
        try:
            for name, (path, body) in posts.items():
                started = time.perf_counter()
                response = client.post(path, headers=auth, **body)  # type: ignore[arg-type]
                took[name] = time.perf_counter() - started
                print(f"\nconveyor api, {name} of a written-out list: {response.status_code} in "
                      f"{took[name]:.2f} s", end="")  # fmt: skip
                assert response.status_code in (400, 422), response.text
                assert "documents.max_nodes" in response.text
            time.sleep(0.3)
        finally:
            stop.set()
            prober.join(60)
    print(f"\nslowest /health/live {max(gaps) * 1000:.0f} ms over {len(gaps)} probes")
    # The time each refusal takes is printed, not asserted (about a second alone, 3-7 s in a
    # loaded CI run; the YAML was 27-50 s before): what must hold is the refusal naming the bound
    # (above) and the API answering throughout.
    assert max(gaps) < 3.0  # a stall, not a slow probe on a loaded machine (1.1 s seen in CI; the stall was 6.6 s)
