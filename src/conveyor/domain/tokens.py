"""API tokens: format, hashing and roles (no I/O; used by the API and the CLI).

A token is ``cvy_`` + 43 URL-safe characters (256 random bits), shown once and stored as
its SHA-256: with that much entropy a slow password hash would only add latency."""

from __future__ import annotations

import hashlib
import secrets
from enum import IntEnum

PREFIX = "cvy_"


class Role(IntEnum):
    """Ordered: a viewer reads; an operator also runs, cancels and replays; an admin also
    manages workers, tokens and (later) policies."""

    viewer = 1
    operator = 2
    admin = 3


def new_token() -> str:
    return PREFIX + secrets.token_urlsafe(32)


def token_hash(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def token_row(name: str, role: Role) -> tuple[str, dict[str, object]]:
    """A new token and the parameters of the ``create_token`` query."""
    token = new_token()
    return token, {"name": name, "role": role.name, "hash": token_hash(token), "prefix": token[: len(PREFIX) + 6]}
