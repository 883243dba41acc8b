"""``conveyor webhooks create|list|get|delete|enable|disable``: webhook doors
(``POST /api/v1/webhooks/NAME``) and the trigger each emits events on.

Secrets never go on the command line (where ``ps`` and shell history see them): an HMAC
secret or bearer token is read from an environment variable or a file, or generated
(printed once, alone on stdout). Listings show whether one is set, never its value."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from conveyor.cli.context import JsonOption, JsonResultOption, console, err_console, print_json, state, when
from conveyor.cli.run import parse_json
from conveyor.domain.documents import DocumentError
from conveyor.domain.errors import ConveyorError
from conveyor.domain.webhooks import new_secret

app = typer.Typer(help="Webhooks: HTTP doors that emit events for rules.", no_args_is_help=True)
Name = Annotated[str, typer.Argument(help="The webhook's name (its door: POST /api/v1/webhooks/NAME).")]


def _from_env(var: str) -> str:
    value = os.environ.get(var)
    if not value:
        raise ConveyorError(f"environment variable {var} is not set or empty")
    return value


def _from_file(path: Path) -> str:
    try:
        value = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConveyorError(f"cannot read {path}: {exc}") from None
    if not value:
        raise ConveyorError(f"{path} is empty")
    return value


def _schema(path: Path | None) -> Any:
    if path is None:
        return None
    try:
        return parse_json(_from_file(path))
    except DocumentError as exc:
        raise ConveyorError(f"{path}: {exc}") from None
    except ValueError as exc:  # JSONDecodeError, and numbers JSON cannot carry
        raise ConveyorError(f"{path} is not JSON: {exc}") from None


@app.command()
def create(
    name: Name,
    trigger: Annotated[str | None, typer.Option(help="Its trigger (default: the webhook's name).")] = None,
    hmac_secret_env: Annotated[str | None, typer.Option(help="HMAC secret from this environment variable.")] = None,
    hmac_secret_file: Annotated[Path | None, typer.Option(help="HMAC secret from this file.")] = None,
    generate_secret: Annotated[bool, typer.Option(help="Generate an HMAC secret (printed once).")] = False,
    bearer_token_env: Annotated[str | None, typer.Option(help="Bearer token from this variable.")] = None,
    no_auth: Annotated[bool, typer.Option("--no-auth", help="Anyone who can reach the API may post.")] = False,
    signature_header: Annotated[str | None, typer.Option(help="Default X-Hub-Signature-256.")] = None,
    signature_prefix: Annotated[str | None, typer.Option(help="Default 'sha256='.")] = None,
    idempotency_header: Annotated[str | None, typer.Option(help="Default Idempotency-Key.")] = None,
    max_body: Annotated[int | None, typer.Option("--max-body", help="Body limit in bytes (default 1 MiB).")] = None,
    schema: Annotated[
        Path | None, typer.Option(help='JSON Schema file for the event payload {"body": ..., "headers": ...}.')
    ] = None,
    description: Annotated[str | None, typer.Option(help="What it is for.")] = None,
    as_json: bool = JsonResultOption,
) -> None:
    """Create or update webhook NAME and its trigger. Exactly one way to authenticate.

    On update, --hmac-secret-*/--bearer-token-env may be left out to keep the stored one
    (give the same kind of auth: e.g. --no-auth replaces any secret). --json: the webhook as
    `get --json` shows it, with "created_now" and, when generated, its "secret"."""
    chosen = [
        hmac_secret_env is not None,
        hmac_secret_file is not None,
        generate_secret,
        bearer_token_env is not None,
        no_auth,
    ]
    if sum(chosen) > 1:
        raise ConveyorError(
            "choose one of --hmac-secret-env, --hmac-secret-file, --generate-secret, --bearer-token-env and --no-auth"
        )
    secret = token = None
    if hmac_secret_env is not None:
        secret = _from_env(hmac_secret_env)
    elif hmac_secret_file is not None:
        secret = _from_file(hmac_secret_file)
    elif generate_secret:
        secret = new_secret()
    elif bearer_token_env is not None:
        token = _from_env(bearer_token_env)
    auth = "none" if no_auth else "bearer" if token is not None else "hmac"
    payload_schema = _schema(schema)
    with state.client() as client:
        saved = client.register_webhook(
            name,
            auth=auth,
            trigger=trigger,
            secret=secret,
            token=token,
            signature_header=signature_header,
            signature_prefix=signature_prefix,
            idempotency_header=idempotency_header,
            max_body_bytes=max_body,
            description=description,
            payload_schema=payload_schema,
        )
    if as_json:
        print_json({**saved, **({"secret": secret} if generate_secret else {})})
        return
    verb = "created" if saved["created_now"] else "updated"
    err_console.print(f"webhook {name} {verb} (auth {auth}): POST /api/v1/webhooks/{name}", highlight=False)
    if generate_secret:
        err_console.print("its HMAC secret is shown only now; give it to the sender:")
        print(secret, flush=True)


def _show(row: dict[str, Any]) -> str:
    if row["auth"] == "hmac":
        return f"hmac ({row['signature_header']}: {row['signature_prefix']}…, secret set)"
    return "bearer (token set)" if row["auth"] == "bearer" else "none"


@app.command("list")
def list_(as_json: bool = JsonOption) -> None:
    """Every webhook (never a secret: whether one is set)."""
    with state.client() as client:
        rows = client.webhooks()
    if as_json:
        print_json(rows)
        return
    table = Table("name", "trigger", "auth", "enabled", "events", "last event")
    for r in rows:
        table.add_row(
            r["name"], r["trigger"], _show(r), "yes" if r["enabled"] else "no", str(r["events"]), when(r["last_event"])
        )
    console.print(table)


@app.command()
def get(name: Name, as_json: bool = JsonOption) -> None:
    """One webhook's settings."""
    with state.client() as client:
        row = client.webhook(name)
    if as_json:
        print_json(row)
        return
    for label, value in [
        ("name", row["name"]),
        ("door", f"POST /api/v1/webhooks/{row['name']}"),
        ("trigger", row["trigger"]),
        ("auth", _show(row)),
        ("idempotency header", row["idempotency_header"]),
        ("max body", f"{row['max_body_bytes']} bytes"),
        ("enabled", "yes" if row["enabled"] else "no"),
        ("payload schema", json.dumps(row["payload_schema"]) if row["payload_schema"] else "-"),
        ("events", str(row["events"])),
        ("last event", when(row["last_event"])),
        ("description", row["description"] or "-"),
    ]:
        console.print(f"{label + ':':20} {value}", highlight=False)


@app.command()
def delete(name: Name, as_json: bool = JsonResultOption) -> None:
    """Delete it: its door answers 404. Its events are kept."""
    with state.client() as client:
        client.delete_webhook(name)
    if as_json:
        print_json({"deleted": name})
        return
    console.print(f"webhook {name} deleted", highlight=False)


def _enable(name: str, enabled: bool, as_json: bool) -> None:
    with state.client() as client:
        row = client.enable_webhook(name, enabled)
        if as_json:
            print_json({**client.webhook(name), "changed": row["was"] != enabled})
            return
    now = "enabled" if enabled else "disabled (its door answers 404)"
    console.print(f"webhook {name} {now}" + (" already" if row["was"] == enabled else ""), highlight=False)


@app.command()
def enable(name: Name, as_json: bool = JsonResultOption) -> None:
    """Open its door again."""
    _enable(name, True, as_json)


@app.command()
def disable(name: Name, as_json: bool = JsonResultOption) -> None:
    """Close its door (404, as an unknown webhook) until enabled."""
    _enable(name, False, as_json)
