"""What an action produces, made storable before any write (``domain/storable.py``), and
the runners applying it: output kept exactly (base64 when it is not UTF-8 text), returned
values stored as JSON, cut at the output limit, or refused with the reason."""

from __future__ import annotations

import base64
import json
import sys
from typing import Any

import pytest

from conveyor.actions.registry import ActionDefinition
from conveyor.domain.storable import (
    BASE64,
    UTF8,
    Unstorable,
    capped_text,
    clean_text,
    describe,
    output_text,
    readable,
    stored_value,
)
from conveyor.worker.runners import run_python, run_subprocess

PY = sys.executable


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


# -- output ---------------------------------------------------------------------------------


def test_utf8_output_stays_text() -> None:
    assert output_text("héllo ✓\n".encode()) == ("héllo ✓\n", UTF8)
    assert output_text(b"") == ("", UTF8)


@pytest.mark.parametrize("raw", [b"a\x00b", b"\xff\xfeabc", b"ok\xed\xa0\x80", b"caf\xe9"])
def test_output_with_nul_or_not_utf8_is_base64_of_the_exact_bytes(raw: bytes) -> None:
    text, encoding = output_text(raw)
    assert encoding == BASE64
    assert base64.b64decode(text) == raw


def test_output_cut_inside_a_character_drops_that_character_only_when_truncated() -> None:
    raw = "ab✓".encode()[:-1]  # the check mark's last byte is missing
    assert output_text(raw, truncated=True) == ("ab", UTF8)
    assert output_text(raw, truncated=False) == (b64(raw), BASE64)  # not cut by us: kept exactly
    bad = b"\xff" + "✓".encode()[:-1]
    assert output_text(bad, truncated=True) == (b64(bad), BASE64)


def test_readable_shows_base64_output_with_escapes() -> None:
    assert readable(b64(b"a\x00b\xffc\n"), BASE64) == "a\\x00b\\xffc\n"
    assert readable("plain", UTF8) == "plain"
    assert readable("plain", None) == "plain"
    assert readable("not base64!", BASE64) == "not base64!"


# -- returned values --------------------------------------------------------------------------


def test_json_values_are_stored_in_their_json_form() -> None:
    assert stored_value({1: (1, 2), "k": [None, True, 1.5]}, 1024) == ({"1": [1, 2], "k": [None, True, 1.5]}, False)
    # Text that only looks like an escape is text: a backslash, then "u0000".
    assert stored_value({"\\u0000": "\\\\u0000"}, 1024) == ({"\\u0000": "\\\\u0000"}, False)


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("a\x00b", "contains a NUL character (\\u0000), which PostgreSQL cannot store"),
        ({"k\x00": 1}, "contains a NUL character"),
        (["\\\x00"], "contains a NUL character"),
        ("\ud800", "contains an unpaired surrogate (\\ud800), which is not valid Unicode"),
        ({"x": ["ok", "\udfff"]}, "unpaired surrogate (\\udfff)"),
        (float("nan"), "it has no JSON form (Out of range float values are not JSON compliant"),
        ([float("inf")], "it has no JSON form (Out of range float values"),
        (b"bytes", "it has no JSON form (Object of type bytes is not JSON serializable)"),
        ({1, 2}, "Object of type set is not JSON serializable"),
        ({(1, 2): 3}, "keys must be str, int, float, bool or None"),
        (10**5000, "it has no JSON form (Exceeds the limit"),
    ],
    ids=lambda value: None if isinstance(value, str) else "value",  # the default would print a 5000-digit int
)
def test_values_postgresql_cannot_hold_are_refused_with_the_reason(value: Any, reason: str) -> None:
    with pytest.raises(Unstorable) as refused:
        stored_value(value, 1 << 20)
    assert reason in str(refused.value)


def test_cycles_and_deep_nesting_are_refused() -> None:
    cycle: list[Any] = []
    cycle.append(cycle)
    with pytest.raises(Unstorable, match="Circular reference"):
        stored_value(cycle, 1024)
    deep: list[Any] = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(Unstorable, match="nested too deeply"):
        stored_value(deep, 1 << 30)


def test_a_value_whose_conversion_raises_is_refused() -> None:
    class Odd(dict[str, Any]):
        def items(self) -> Any:
            raise RuntimeError("no items for you")

    with pytest.raises(Unstorable) as refused:
        stored_value(Odd(a=1), 1024)
    assert str(refused.value) == "converting it to JSON failed (RuntimeError: no items for you)"


def test_a_value_over_the_limit_is_cut_to_the_start_of_its_json_text() -> None:
    assert stored_value("x" * 8, 10) == ("x" * 8, False)  # its JSON text is exactly the limit: kept
    assert stored_value("x" * 9, 10) == ('"xxxxxxxxx', True)
    data, cut = stored_value(["é" * 10], 6)  # '["éé' is 6 bytes; a partial é is dropped
    assert (data, cut) == ('["éé', True)
    data, cut = stored_value(["é" * 10], 7)
    assert (data, cut) == ('["éé', True)


# -- diagnostics ---------------------------------------------------------------------------------


def test_clean_text_escapes_and_cuts() -> None:
    assert clean_text("a\x00b\ud800c") == "a\\x00b\\ud800c"
    assert clean_text("x" * 20, 5) == "xxxxx… (20 characters, cut)"
    assert capped_text("é" * 4, 5) == ("éé", True)
    assert capped_text("a\x00", 10) == ("a\\x00", False)


def test_describe_survives_exceptions_that_cannot_be_shown() -> None:
    class Broken(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    assert describe(Broken()) == "Broken: <str() of the exception failed>"
    assert describe(ValueError("a\x00\ud800")) == "ValueError: a\\x00\\ud800"
    assert describe(KeyError()) == "KeyError"


# -- the runners -----------------------------------------------------------------------------------


def definition(value: Any) -> ActionDefinition:
    return ActionDefinition(ref="t.value", runner_type="python", runtime="python", parameters_schema={},
                            func=lambda: value)  # fmt: skip


async def test_python_values_with_nul_or_a_lone_surrogate_fail_the_run_clearly() -> None:
    for value, why in [("a\x00b", "NUL character"), ("\ud800", "unpaired surrogate")]:
        result = await run_python(definition(value), {}, timeout=5)
        assert not result.succeeded
        assert result.data is None
        assert result.error is not None
        assert result.error.startswith("the returned value cannot be stored: a string in it contains")
        assert why in result.error
        json.dumps(result.to_json()).encode()  # storable: strict UTF-8 holds it


async def test_python_value_over_the_limit_is_truncated_and_flagged() -> None:
    result = await run_python(definition("y" * 5000), {}, timeout=5, output_limit=1024)
    assert result.succeeded
    assert result.data_truncated
    assert result.data == '"' + "y" * 1023
    small = await run_python(definition({"a": 1}), {}, timeout=5, output_limit=1024)
    assert (small.data, small.data_truncated) == ({"a": 1}, False)


async def test_python_exception_text_is_escaped_and_its_traceback_capped() -> None:
    def boom() -> None:
        raise ValueError("bad \x00 \ud800 " + "z" * 5000)

    func = ActionDefinition(ref="t.boom", runner_type="python", runtime="python", parameters_schema={}, func=boom)
    result = await run_python(func, {}, timeout=5, output_limit=1024)
    assert not result.succeeded
    assert result.error is not None
    assert result.error.startswith("ValueError: bad \\x00 \\ud800 zzz")
    assert result.stderr_truncated
    assert len(result.stderr.encode()) <= 1024
    assert "\x00" not in result.stderr
    json.dumps(result.to_json()).encode()


def meta(code: str, output: str = "text") -> dict[str, Any]:
    return {"argv": [PY, "-c", code], "shell": False, "output": output, "stdin": "none"}


async def run(metadata: dict[str, Any], limit: int = 4096) -> Any:
    return await run_subprocess(metadata, {}, timeout=10, kill_grace=0.5, output_limit=limit)


async def test_command_output_with_nul_or_invalid_utf8_is_kept_exactly() -> None:
    code = "import sys; sys.stdout.buffer.write(b'a\\x00b'); sys.stderr.buffer.write(b'\\xff\\xfe!')"
    result = await run(meta(code))
    assert result.succeeded, result
    assert (result.stdout_encoding, result.stderr_encoding) == (BASE64, BASE64)
    assert base64.b64decode(result.stdout) == b"a\x00b"
    assert base64.b64decode(result.stderr) == b"\xff\xfe!"
    assert result.to_json()["stdout_encoding"] == BASE64
    plain = await run(meta("print('fine')"))
    assert (plain.stdout, plain.stdout_encoding) == ("fine\n", UTF8)


async def test_truncated_command_output_ends_on_a_whole_character() -> None:
    result = await run(meta("import sys; sys.stdout.write('é' * 3000)"), limit=1025)
    assert result.stdout_truncated
    assert (result.stdout, result.stdout_encoding) == ("é" * 512, UTF8)


@pytest.mark.parametrize(
    ("printed", "error"),
    [
        ('{"a": "x\\u0000y"}', "stdout is JSON that cannot be stored: a string in it contains a NUL"),
        ('["\\ud800"]', "stdout is JSON that cannot be stored: a string in it contains an unpaired surrogate"),
        ("[NaN]", "stdout is JSON that cannot be stored: it has no JSON form"),
        ("[1, \xff]", "stdout is not valid JSON"),
    ],
)
async def test_command_json_output_postgresql_cannot_hold_fails_clearly(printed: str, error: str) -> None:
    code = f"import sys; sys.stdout.buffer.write({printed.encode('latin-1')!r})"
    result = await run(meta(code, output="json"))
    assert not result.succeeded
    assert result.data is None
    assert result.error is not None
    assert result.error.startswith(error), result.error


# -- what users give the doors (issue #25) ----------------------------------------------------


def test_storable_problems_name_the_path_of_each_problem() -> None:
    from conveyor.domain.storable import storable_problems, unstorable

    doc = {"ok": ["fine", 1, 2.5, None], "tasks": [{"input": {"x": "a\x00b"}}], "k\ud800": 1, "d": {"n": float("nan")}}
    assert list(storable_problems(doc)) == [
        ("tasks[0].input.x", "contains a NUL character (\\u0000), which cannot be stored"),
        ("key 'k\\ud800'", "contains an unpaired surrogate (\\ud800), which is not valid Unicode and cannot be stored"),
        ("d.n", "nan is not a JSON number"),
    ]
    assert list(unstorable("\udcff", "description")) == [
        "description: contains an unpaired surrogate (\\udcff), which is not valid Unicode and cannot be stored"
    ]
    assert list(storable_problems({"a": "é ✓ \U0001f600", "b": "\\x00 \\ud800"})) == []


def test_an_answer_with_a_nul_is_refused_before_the_database() -> None:
    """A schema may well accept {"r": "a\\u0000b"}: jsonb does not (a traceback before)."""
    from conveyor.domain.errors import InvalidAnswerError
    from conveyor.verbs.inquiries import check_answer

    with pytest.raises(InvalidAnswerError) as refused:
        check_answer(7, {"type": "object"}, {"r": "a\x00b"})
    assert refused.value.problems == [("data.r", "contains a NUL character (\\u0000), which cannot be stored")]
