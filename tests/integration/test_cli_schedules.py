"""``conveyor schedules ...`` (issue #13): the commands as the issue names them; bad
input is one line on stderr, no traceback."""

from __future__ import annotations

import json

import pytest

from integration.test_cli_sdk_workflows import Cli, cli  # noqa: F401 - the fixture


def test_create_list_get_pause_resume_fire_backfill_delete(cli: Cli) -> None:  # noqa: F811
    code, out, err = cli("schedules", "create", "tick", "--interval", "30s", "core.echo", "message=hi",
                         "--overlap", "skip", "--catchup", "all", "--catchup-window", "10m")  # fmt: skip
    assert code == 0, err
    assert "schedule tick created; next fire" in out
    code, out, err = cli("schedules", "create", "nightly", "--cron", "30 2 * * *", "--timezone", "Europe/Paris")
    assert code == 0, err
    code, out, _ = cli("schedules", "list", "--json")
    rows = json.loads(out)
    assert [r["name"] for r in rows] == ["nightly", "tick"]
    assert rows[0]["trigger"] == "nightly"
    assert rows[1]["parameters"] == {"message": "hi"}
    assert cli("schedules", "fire", "tick")[1].startswith("schedule tick fired: requested execution")
    code, out, _ = cli("schedules", "get", "tick")
    assert code == 0
    assert "recent slots" in out
    assert "manual" in out
    assert "next:" in out
    got = json.loads(cli("schedules", "get", "tick", "--json", "--next", "3")[1])
    assert len(got["next_fire_times"]) == 3
    assert got["slots"][0]["execution"]
    assert cli("schedules", "pause", "tick")[1].strip() == "schedule tick paused"
    assert cli("schedules", "resume", "tick")[1].strip() == "schedule tick resumed"
    since = got["created"]
    code, out, err = cli("schedules", "backfill", "tick", "--since", since, "--until", _plus(since, 120))
    assert code == 0, err
    assert out.strip() == "schedule tick: 4 slots fired"
    assert cli("schedules", "delete", "tick")[1].strip() == "schedule tick deleted"


def _plus(iso: str, seconds: int) -> str:
    from datetime import datetime, timedelta

    return (datetime.fromisoformat(iso) + timedelta(seconds=seconds)).isoformat()


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--cron", "99 * * * *", "core.noop"], "invalid cron expression"),
        (["--cron", "* * * * *", "--timezone", "Moon/Base", "core.noop"], "unknown time zone"),
        (["--interval", "soon", "core.noop"], "interval 'soon': not a duration"),
        (["core.noop"], "exactly one of --cron, --interval or --at"),
        (["--interval", "5s", "no.such"], "no.such"),
    ],
)
def test_bad_input_is_one_line(cli: Cli, args: list[str], words: str) -> None:  # noqa: F811
    code, _, err = cli("schedules", "create", "bad", *args)
    assert code == 1
    assert words in err
    assert len(err.strip().splitlines()) == 1
    assert "Traceback" not in err


def test_unknown_schedule(cli: Cli) -> None:  # noqa: F811
    for verb in ("get", "pause", "resume", "fire", "delete"):
        code, _, err = cli("schedules", verb, "ghost")
        assert code == 1, verb
        assert "no schedule 'ghost'" in err, (verb, err)
