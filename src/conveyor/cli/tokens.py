"""``conveyor tokens create|list|revoke``: API and dashboard tokens."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

import typer
from rich.table import Table

from conveyor.cli.context import JsonOption, JsonResultOption, console, err_console, print_json, state, when
from conveyor.domain.errors import ConveyorError
from conveyor.domain.tokens import Role, token_row
from conveyor.sdk import Client
from conveyor.store.queries import Q


class RoleName(StrEnum):
    viewer = "viewer"
    operator = "operator"
    admin = "admin"


app = typer.Typer(help="API and dashboard tokens (stored hashed; shown once).", no_args_is_help=True)


@app.command()
def create(
    role: Annotated[RoleName, typer.Option(help="viewer reads; operator also runs and cancels; admin manages")],
    name: Annotated[str | None, typer.Option(help="What the token is for (shown in listings)")] = None,
    as_json: bool = JsonResultOption,
) -> None:
    """Create a token and print it once: alone on the last line of stdout, for scripts
    (with --json: as `tokens list --json` shows it, plus "token")."""
    label = name or f"{role.value} token"
    token, params = token_row(label, Role[role.value])
    with state.client() as client, client.conn.transaction():
        row = client.conn.execute(Q["create_token"], params).fetchone()
        assert row is not None
        if as_json:
            print_json({**_token(client, row["id"]), "token": token})
            return
    err_console.print(f"token {row['id']} ({label}, {role.value}) created; it is shown only now:")
    print(token, flush=True)


@app.command("list")
def list_(as_json: bool = JsonOption) -> None:
    """Every token (never the token itself: its first characters)."""
    with state.client() as client:
        rows = list(client.conn.execute(Q["list_tokens"]).fetchall())
    if as_json:
        print_json(rows)
        return
    table = Table("id", "name", "role", "starts with", "created", "last used", "revoked")
    for r in rows:
        table.add_row(str(r["id"]), r["name"], r["role"], r["prefix"] + "…", when(r["created"]),
                      when(r["last_used"]), when(r["revoked"]))  # fmt: skip
    console.print(table)


@app.command()
def revoke(
    token_id: Annotated[int, typer.Argument(help="Token id (see `tokens list`)")], as_json: bool = JsonResultOption
) -> None:
    """Revoke a token: refused by the API within seconds."""
    if not 1 <= token_id <= 2**62:  # revoke_api_token takes a bigint: none is out of that range
        raise ConveyorError(f"no live token with id {token_id}")
    with state.client() as client:
        row = client.conn.execute(Q["revoke_token"], {"id": token_id}).fetchone()
        if row is None:
            raise ConveyorError(f"no live token with id {token_id}")
        if as_json:
            print_json(_token(client, token_id))
            return
    console.print(f"token {token_id} revoked")


def _token(client: Client, token_id: int) -> dict[str, Any]:
    """The token as ``tokens list --json`` shows it (never the token itself)."""
    row = next((r for r in client.conn.execute(Q["list_tokens"]).fetchall() if r["id"] == token_id), None)
    if row is None:  # tokens are revoked, never deleted: a bug
        raise ConveyorError(f"token {token_id} is gone")
    return dict(row)
