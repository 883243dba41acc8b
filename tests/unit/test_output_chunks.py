"""The worker's live-output chunks (worker/output.py): cut where a reader can decode each
chunk alone, capped like the result's output."""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from conveyor.worker.output import OutputWriter, utf8_cut


@given(st.text(), st.integers(min_value=0, max_value=64))
def test_a_cut_never_splits_a_character_and_holds_back_at_most_three_bytes(text: str, at: int) -> None:
    data = text.encode("utf-8", "surrogatepass")[:at]
    cut = utf8_cut(data)
    assert len(data) - 3 <= cut <= len(data)
    data[:cut].decode("utf-8", "surrogatepass")  # never raises: the head ends on a boundary


def test_bytes_that_are_not_utf8_are_not_held_back_for_ever() -> None:
    assert utf8_cut(b"\xe9\xe9\xe9\xe9\xe9") == 5 - 1  # a lone lead byte may start a character
    assert utf8_cut(b"\x80\x80\x80\x80") == 4  # continuation bytes only: nothing to wait for
    assert utf8_cut(b"ab\xc3") == 2
    assert utf8_cut(b"ab\xc3\xa9") == 4


def test_each_stream_is_capped_and_taken_in_order() -> None:
    async def go() -> Any:
        writer = OutputWriter(None, "w", limit=10, interval=1.0)  # type: ignore[arg-type]
        run = writer.open(1, 1)
        run.write("stdout", b"0123456")
        run.write("stdout", b"789abc")  # 10 bytes kept of stdout, as the result keeps
        run.write("log", b"caf\xc3")  # an unfinished character waits for the rest...
        first = run.take(final=False)
        run.write("log", b"\xa9\n")
        return first, run.take(final=False), run.take(final=True)

    first, second, last = asyncio.run(go())
    assert first == [("stdout", b"0123456789"), ("log", b"caf")]
    assert second == [("log", b"\xc3\xa9\n")]
    assert last == []


def test_a_burst_is_cut_into_chunks_on_character_boundaries() -> None:
    async def go() -> Any:
        writer = OutputWriter(None, "w", limit=10 * 1024 * 1024, interval=1.0)  # type: ignore[arg-type]
        run = writer.open(1, 1)
        burst = "é" * (600 * 1024)  # 1.2 MB of two-byte characters
        run.write("stdout", burst.encode())
        return burst, run.take(final=False)

    burst, chunks = asyncio.run(go())
    assert len(chunks) > 4
    assert all(len(data) <= 256 * 1024 for _, data in chunks)
    assert "".join(data.decode() for _, data in chunks) == burst  # each chunk decodes alone
