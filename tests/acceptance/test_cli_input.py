"""Acceptance: the command line with awkward input, as a user meets it. User data that
looks like Rich markup is shown as it is; bad parameters, databases and settings are one
line on stderr, never a traceback; ``--import`` finds a module in the current directory;
``config show`` shows no password."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import psycopg
import pytest

from acceptance.helpers import Procs, conveyor_env, describe
from conveyor.store.migrate import known_migrations

pytestmark = pytest.mark.acceptance

PATTERN = "^[a-z][a-z0-9_]{0,15}$"
SCHEMA = {
    "type": "object",
    "required": ["tag"],
    "additionalProperties": False,
    "properties": {"tag": {"type": "string", "pattern": PATTERN}},
}
DESCRIPTION = "Tag [/oops] it [red]x[/red] :smile: [bold"
ACTIONS = f"""\
from conveyor import action


@action("shop.tag", description={DESCRIPTION!r}, parameters={SCHEMA!r})
def tag(tag: str) -> str:
    return tag
"""


@pytest.fixture
def env(db_url: str) -> dict[str, str]:
    return conveyor_env(db_url)


def one_line_error(result: subprocess.CompletedProcess[str], text: str | None = None) -> str:
    """The command failed with exactly one line on stderr (containing ``text``)."""
    assert result.returncode == 1, describe(result)
    assert result.stderr.startswith("error: "), describe(result)
    assert result.stderr.count("\n") == 1, describe(result)
    if text is not None:
        assert text in result.stderr, describe(result)
    return result.stderr


def start_worker_in(procs: Procs, directory: Path, name: str) -> None:
    """``conveyor worker --import myactions`` run from ``directory``, which is not on
    PYTHONPATH; PYTHONSAFEPATH keeps ``python -m`` from adding the current directory to
    sys.path, as the installed ``conveyor`` script does not add it either."""
    env = {**procs.env, "PYTHONSAFEPATH": "1"}
    assert str(directory) not in env.get("PYTHONPATH", "").split(os.pathsep)
    worker = procs.start("worker", "--import", "myactions", "--name", name, name="worker", env=env, cwd=directory)
    worker.wait_for_log("worker registered")


def test_import_finds_a_module_in_the_current_directory(procs: Procs, tmp_path: Path) -> None:
    (tmp_path / "myactions.py").write_text(ACTIONS)
    start_worker_in(procs, tmp_path, "w-import")
    assert "shop.tag" in {a["ref"] for a in procs.json("actions", "list")}


def test_markup_like_user_data_is_shown_as_it_is(procs: Procs, tmp_path: Path) -> None:
    (tmp_path / "myactions.py").write_text(ACTIONS)
    executor = procs.start("executor", name="executor")
    executor.wait_for_log("executor started")
    # What the seeds' troubleshooting greps the executor's log for.
    executor.wait_for_log("heartbeat monitor started")
    start_worker_in(procs, tmp_path, "w-markup")

    ids = []
    for message in ("[/oops]", "[red]x[/red]", "[bold", ":smile:"):
        waited = procs.run("run", "core.echo", f"message={message}", "--wait")
        assert waited.returncode == 0, describe(waited)
        assert f'data: "{message}"' in waited.stdout, describe(waited)
        assert f'parameters: {{"message": "{message}"}}' in waited.stdout, describe(waited)
        listed = procs.json("executions", "list", "--limit", "1")
        ids.append(listed[0]["id"])
        shown = procs.run("executions", "get", str(ids[-1]))
        assert shown.returncode == 0, describe(shown)
        assert f'data: "{message}"' in shown.stdout, describe(shown)
        assert "│ w-markup " in shown.stdout, describe(shown)  # the attempts table

    table = procs.run("executions", "list")
    assert table.returncode == 0, describe(table)
    assert table.stdout.count(" core.echo ") == len(ids), describe(table)
    for command in (("actions", "get", "shop.tag"), ("actions", "list")):
        shown = procs.run(*command)
        assert DESCRIPTION in shown.stdout, describe(shown)

    # The schema's pattern, quoted by the error, keeps its brackets and braces.
    refused = procs.run("run", "shop.tag", "tag=Not OK")
    one_line_error(refused, f"'Not OK' does not match '{PATTERN}'")
    one_line_error(procs.run("run", "core.sleep", "seconds=[/oops"), "seconds: '[/oops' is not of type 'number'")


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "1e400", "[NaN]"])
def test_numbers_json_cannot_carry_are_one_line(procs: Procs, value: str) -> None:
    refused = procs.run("run", "core.sleep", f"seconds={value}", "--wait")
    one_line_error(refused, "is not a number JSON can carry")
    assert refused.stdout == ""
    assert procs.json("executions", "list") == []  # nothing was requested


COMMANDS = [
    ("executions", "list"), ("executions", "get", "1"), ("executions", "cancel", "1"),
    ("run", "core.echo", "message=x"),
    ("workers", "list"), ("workers", "cordon", "w"), ("actions", "list"), ("policies", "list"),
    ("policies", "set", "core.echo", "-n", "1"), ("dead-letters", "list"), ("dead-letters", "replay", "1"),
    ("tokens", "list"),
]  # fmt: skip


NEVER_MIGRATED = "the database has no Conveyor schema 'conveyor' (it was never migrated): run `conveyor migrate` first"


def test_a_database_never_migrated_says_to_migrate(procs: Procs, empty_db_url: str) -> None:
    env = conveyor_env(empty_db_url)
    for command in COMMANDS:
        err = one_line_error(procs.run(*command, env=env))
        assert err == f"error: {NEVER_MIGRATED}\n", command
    assert procs.run("config", "show", env=env).returncode == 0


def test_a_database_migrated_by_an_older_conveyor_says_to_migrate(
    procs: Procs, env: dict[str, str], db_url: str
) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("DROP TABLE conveyor.dead_letter, conveyor.admission_policy CASCADE")
        conn.execute("DELETE FROM conveyor.schema_migration WHERE version >= 4")
    newest = known_migrations()[-1].version
    for command in (("policies", "list"), ("dead-letters", "list")):
        one_line_error(
            procs.run(*command),
            f"schema 'conveyor' is at version 3, this Conveyor needs {newest}: run `conveyor migrate`",
        )


def test_bad_settings_are_one_line(procs: Procs, env: dict[str, str]) -> None:
    for url in ("mysql://u:secret@db/app", "sqlite:///conveyor.db"):
        err = one_line_error(procs.run("executions", "list", env={**env, "DATABASE_URL": url}), "not a PostgreSQL URL")
        assert "secret" not in err
    one_line_error(
        procs.run("workers", "list", env={**env, "CONVEYOR__WORKERS__HEARTBEAT_INTERVAL": "5"}),
        "unknown setting CONVEYOR__WORKERS__HEARTBEAT_INTERVAL (did you mean CONVEYOR__WORKER__HEARTBEAT_INTERVAL?)",
    )


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u:secret@db/app",
        "postgresql://u@db/app?password=secret",
        "host=db password=secret",
        "postgresql://u@db/app?sslpassword=secret",  # issue #25: shown in clear before
        "postgresql://u@db/app?pass%77ord=secret",
    ],
)
def test_config_show_masks_passwords(procs: Procs, url: str) -> None:
    env = conveyor_env(url, CONVEYOR__MESSAGE_QUEUE__URL="amqp://guest:secret@mq:5672/")
    shown = procs.json("config", "show", env=env)
    assert "secret" not in json.dumps(shown)
    assert shown["message_queue.url"]["value"] == "amqp://guest:***@mq:5672/"
    assert re.search(r"\*\*\*", shown["database.url"]["value"])
    table = procs.run("config", "show", env=env)
    assert table.returncode == 0, describe(table)
    assert "secret" not in table.stdout, describe(table)
