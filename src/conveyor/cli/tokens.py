"""``conveyor tokens create|list|revoke``: API and dashboard tokens."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer
from rich.table import Table

from conveyor.cli.context import JsonOption, JsonResultOption, console, err_console, print_json, state, when


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
    with state.client() as client:
        token, row = client.create_token(role.value, label)
        if as_json:
            print_json({**client.token(row["id"]), "token": token})
            return
    err_console.print(f"token {row['id']} ({label}, {role.value}) created; it is shown only now:")
    print(token, flush=True)


@app.command("list")
def list_(as_json: bool = JsonOption) -> None:
    """Every token (never the token itself: its first characters)."""
    with state.client() as client:
        rows = client.tokens()
    if as_json:
        print_json(rows)
        return
    table = Table("id", "name", "role", "starts with", "created", "last used", "revoked")
    for r in rows:
        table.add_row(
            str(r["id"]),
            r["name"],
            r["role"],
            r["prefix"] + "…",
            when(r["created"]),
            when(r["last_used"]),
            when(r["revoked"]),
        )
    console.print(table)


@app.command()
def revoke(
    token_id: Annotated[int, typer.Argument(help="Token id (see `tokens list`)")], as_json: bool = JsonResultOption
) -> None:
    """Revoke a token: refused by the API within seconds."""
    with state.client() as client:
        client.revoke_token(token_id)
        if as_json:
            print_json(client.token(token_id))
            return
    console.print(f"token {token_id} revoked")
