"""The CLI prints user data literally: action refs, parameters, results, worker names and
error messages may hold Rich markup ("[/oops]", "[red]x[/red]", "[bold") or emoji codes
(":smile:"), which must neither raise nor be swallowed. And ``conveyor run`` refuses
numbers JSON cannot carry with one line, before anything is requested."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from conveyor.cli import context
from conveyor.cli.executions import executions_table, show_execution
from conveyor.cli.main import print_error
from conveyor.cli.run import parse_parameters
from conveyor.domain.errors import ConveyorError
from conveyor.domain.models import Attempt, Execution
from conveyor.domain.status import ExecutionStatus

MARKUP = ["[/oops]", "[red]x[/red]", "[bold", "[bold]b[/]", ":smile:", "^[a-z][a-z0-9_]*$", "[/]", "\\[x]"]

# Printable text on one line: Rich drops control characters (and a table cell is one line).
one_line = st.text(st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp")), min_size=1, max_size=40)
# Random text seldom forms markup: pieces of it make tags, closers and emoji codes often.
PIECES = ["[", "]", "[/", "/", ":", "\\", "=", "red", "bold", "b", "link", "smile", "x", " ", "#", "@"]
markup_soup = st.lists(st.sampled_from(PIECES) | one_line, min_size=1, max_size=10).map("".join)


@pytest.fixture(autouse=True)
def wide_console(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing wrapped: the assertions look for each value whole."""
    monkeypatch.setattr(context.console, "width", 10_000)
    monkeypatch.setattr(context.err_console, "width", 10_000)


def execution(text: str, status: ExecutionStatus = ExecutionStatus.FAILED) -> Execution:
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    return Execution(
        id=7, action_ref=text, parameters={"message": text, text: 1}, status=status,
        result={"succeeded": False, "error": text, "data": text, "stdout": text + "\n", "stderr": text},
        worker=1, worker_name=text, executor=None, parent=None, enforcement=None, attempt=1,
        created=now, updated=now, scheduled=now, started=now, ended=now,
        attempts=(Attempt(1, 1, text, now, now, now, "failed", text),),
    )  # fmt: skip


def rendered(console: Console, fn: object, *args: object) -> str:
    with console.capture() as captured:
        fn(*args)  # type: ignore[operator]
    return captured.get()


def check_show_execution(text: str) -> None:
    out = rendered(context.console, show_execution, execution(text))
    assert out.startswith(f"execution 7  {text}  failed  attempt 1\n"), out
    assert f"parameters: {json.dumps({'message': text, text: 1})}" in out
    assert f"error: {json.dumps(text)}" in out
    assert f"\n{text}\n" in out  # stdout, as it is
    assert f"│ {text} " in out  # the attempts table: worker and error cells


def check_error(text: str) -> None:
    message = f"invalid parameters for core.x: code: {text!r} does not match {text!r}"
    assert rendered(context.err_console, print_error, message) == f"error: {message}\n"


@pytest.mark.parametrize("text", MARKUP)
def test_markup_like_text_is_shown_as_it_is(text: str) -> None:
    check_show_execution(text)
    check_error(text)
    table = rendered(context.console, context.console.print, executions_table([execution(text)]))
    assert f"│ {text} " in table


def test_a_schema_pattern_in_an_error_keeps_every_character() -> None:
    message = "invalid parameters for shop.tag: tag: 'A!' does not match '^[a-z][a-z0-9_]{0,15}$'"
    assert rendered(context.err_console, print_error, message) == f"error: {message}\n"


@settings(max_examples=100, deadline=None)
@given(one_line | markup_soup)
def test_any_text_is_rendered_literally(text: str) -> None:
    check_show_execution(text)
    check_error(text)
    table = rendered(context.console, context.console.print, executions_table([execution(text)]))
    assert text in table


def test_statuses_keep_their_colour() -> None:
    """Styling is explicit (Text), not lost with markup."""
    console = Console(force_terminal=True, color_system="standard", width=200, markup=False)
    with console.capture() as captured:
        console.print(executions_table([execution("core.echo", ExecutionStatus.COMPLETED)]))
    assert "\x1b[32mcompleted" in captured.get()  # green


# -- parameters JSON cannot carry --------------------------------------------------------

NUMBER = {
    "properties": {
        "seconds": {"type": "number"},
        "any": {},
        "either": {"type": ["number", "string"]},
        "message": {"type": "string"},
    }
}


@pytest.mark.parametrize(
    "pair", ["seconds=NaN", "seconds=Infinity", "seconds=-Infinity", "seconds=1e400", "seconds=-1e400",
             "any=NaN", "any=[1, NaN]", 'any={"a": {"b": 1e999}}', "undeclared=Infinity"],
)  # fmt: skip
def test_numbers_json_cannot_carry_are_refused(pair: str) -> None:
    with pytest.raises(ConveyorError, match=r"is not a number JSON can carry") as raised:
        parse_parameters([pair], NUMBER)
    assert "\n" not in str(raised.value)
    assert str(raised.value).startswith(f"parameter {pair.partition('=')[0]}: ")


def test_where_text_is_allowed_nan_stays_text() -> None:
    assert parse_parameters(["either=NaN", "message=Infinity"], NUMBER) == {"either": "NaN", "message": "Infinity"}
    assert parse_parameters(["seconds=1e300", "any=[1.5, -2]"], NUMBER) == {"seconds": 1e300, "any": [1.5, -2]}


def test_the_cli_consoles_show_control_characters_on_a_terminal_only() -> None:
    """issue #25: user data (a prompt, a description) must not drive the terminal."""
    import io

    from rich.table import Table
    from rich.text import Text

    from conveyor.cli.terminal import SafeConsole

    hostile = "\x1b[2J\x1b]0;pwned\x07X\x9b1m"
    table = Table("prompt", "styled")
    table.add_row(hostile, Text(hostile, style="red"))
    for terminal in (True, False):
        out = io.StringIO()
        console = SafeConsole(file=out, force_terminal=terminal, color_system=None, width=200, markup=False)
        console.print(table)
        console.print(hostile)
        console.print(Text.assemble(("a" + hostile, "bold"), " b"))
        if terminal:
            assert "\x1b" not in out.getvalue()
            assert "\x9b" not in out.getvalue()
            # A Text built raw is measured before it is escaped: its cell may be cut (with an
            # ellipsis), never raw; the CLI builds its Text escaped already (context.styled).
            assert out.getvalue().count("\\x1b[2J\\x1b]0;pwned") >= 3
        else:  # piped: the data as it is
            assert out.getvalue().count("\x1b[2J") == 4
