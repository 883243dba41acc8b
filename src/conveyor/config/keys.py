"""Configuration keys: the seeds' names that Conveyor spells differently (aliases),
refusing unknown keys with a suggestion, and masking secrets for display.

The checks work on dotted paths (``worker.heartbeat_interval``) so the YAML file and the
``CONVEYOR__SECTION__KEY`` environment variables share them. pydantic-settings would
silently drop an environment variable whose section does not exist
(``CONVEYOR__WORKERS__NAME``), which is why unknown keys are refused here, before it.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from pydantic import BaseModel

from conveyor.domain.errors import ConveyorError

ENV_PREFIX = "CONVEYOR__"


def _same(value: Any) -> Any:
    return value


def _seconds_to_ms(value: Any) -> Any:
    """The seeds give the worker queue TTL in seconds; RabbitMQ (and this setting) in ms."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = math.nan
    if isinstance(value, bool) or not math.isfinite(seconds):
        raise ValueError(f"{value!r} is not a number of seconds")
    return round(seconds * 1000)


@dataclass(frozen=True, slots=True)
class Alias:
    target: str  # the key (or section) it stands for
    convert: Callable[[Any], Any] = _same


# Keys of the seeds' recommended configuration that Conveyor names otherwise. Documented
# in docs/configuration.md ("Aliases"); every other seed key is Conveyor's own name.
ALIASES: dict[str, Alias] = {
    # Seed 000, "Recommended Timeouts": worker_queue_ttl: 300 (seconds).
    "executor.worker_queue_ttl": Alias("message_queue.rabbitmq.worker_queue_ttl_ms", _seconds_to_ms),
    # Seed 000: how often worker health is checked = how often the dead-worker sweep runs.
    "executor.health_check_interval": Alias("recovery.sweep_interval"),
    # Seed 002 (Attune's layout): dead_letter nested under message_queue.rabbitmq.
    "message_queue.rabbitmq.dead_letter": Alias("dead_letter"),
}


def known_keys(model: type[BaseModel], prefix: str = "") -> dict[str, bool]:
    """Every dotted key of ``model`` (by the name a file or variable uses) -> is a section."""
    keys: dict[str, bool] = {}
    for name, field in model.model_fields.items():
        path = prefix + (field.alias or name)
        annotation = field.annotation
        section = isinstance(annotation, type) and issubclass(annotation, BaseModel)
        keys[path] = section
        if section:
            assert isinstance(annotation, type)
            keys.update(known_keys(annotation, path + "."))
    return keys


class KeyChecker:
    def __init__(self, model: type[BaseModel]) -> None:
        self.keys = known_keys(model)

    def canonical(self, segments: list[str]) -> tuple[list[str], str | None]:
        """The key ``segments`` stand for (aliases resolved), and the first unknown
        prefix of them (``None`` when every segment is known)."""
        canon: list[str] = []
        for i, segment in enumerate(segments):
            if canon and not self.keys.get(".".join(canon), False):
                return canon, ".".join(segments[: i + 1])  # a key below a plain value
            alias = ALIASES.get(".".join([*canon, segment]))
            canon = alias.target.split(".") if alias else [*canon, segment]
            if ".".join(canon) not in self.keys:
                return canon, ".".join(segments[: i + 1])
        return canon, None

    def suggest(self, unknown: str, rest: str = "") -> str | None:
        """A known key (or alias) that ``unknown`` (followed by ``rest``) probably meant."""
        parent, _, last = unknown.rpartition(".")
        leaves = {k.rpartition(".")[2]: k for k in self.keys if not self.keys[k]}
        if last in leaves and not rest:  # the right key in the wrong section
            return leaves[last]
        parent_canon, bad = self.canonical(parent.split(".")) if parent else ([], None)
        if bad is None:
            prefix = ".".join(parent_canon)
            siblings = [k.rpartition(".")[2] for k in [*self.keys, *ALIASES] if k.rpartition(".")[0] == prefix]
            close = difflib.get_close_matches(last, siblings, n=1, cutoff=0.6)
            if close:
                fixed = (parent + "." if parent else "") + close[0]
                whole = f"{fixed}.{rest}" if rest else fixed
                return whole if self.canonical(whole.split("."))[1] is None else fixed
        close = difflib.get_close_matches(last, list(leaves), n=1, cutoff=0.8)
        return leaves[close[0]] if close and not rest else None

    def problem(self, path: str) -> tuple[str, str | None] | None:
        """``None`` for a known key; else its first unknown part and a suggestion."""
        _, bad = self.canonical(path.split("."))
        if bad is None:
            return None
        return bad, self.suggest(bad, path[len(bad) + 1 :]) if bad else None


def file_paths(data: Mapping[str, Any], checker: KeyChecker, prefix: str = "") -> Iterator[str]:
    """The dotted keys of a YAML mapping, descending into known sections only."""
    for key, value in data.items():
        path = f"{prefix}{key}"
        canon, bad = checker.canonical(path.split("."))
        if bad is None and isinstance(value, Mapping) and checker.keys[".".join(canon)]:
            yield from file_paths(value, checker, path + ".")
        else:
            yield path


def env_name(path: str) -> str:
    return ENV_PREFIX + path.replace(".", "__").upper()


def env_path(name: str) -> str:
    """``CONVEYOR__WORKER__NAME`` -> ``worker.name`` (pydantic-settings ignores case)."""
    return name[len(ENV_PREFIX) :].lower().replace("__", ".")


def check_unknown(
    file_data: Mapping[str, Any], file: str | None, environ: Mapping[str, str], checker: KeyChecker
) -> None:
    """Refuse (one line, every offender) keys the settings do not have."""
    problems: list[str] = []
    for path in file_paths(file_data, checker):
        found = checker.problem(path)
        if found is not None:
            bad, hint = found
            problems.append(f"unknown key {bad} in {file}" + (f" (did you mean {hint}?)" if hint else ""))
    for name in sorted(environ):
        if name.upper().startswith(ENV_PREFIX):
            found = checker.problem(env_path(name))
            if found is not None:
                hint = found[1]
                problems.append(f"unknown setting {name}" + (f" (did you mean {env_name(hint)}?)" if hint else ""))
    if problems:
        raise ConveyorError("invalid configuration: " + "; ".join(problems))


def _get(data: Mapping[str, Any], path: list[str]) -> tuple[bool, Any]:
    node: Any = data
    for segment in path:
        if not isinstance(node, Mapping) or segment not in node:
            return False, None
        node = node[segment]
    return True, node


def _set(data: dict[str, Any], path: list[str], value: Any) -> None:
    node = data
    for segment in path[:-1]:
        child = node.get(segment)
        if not isinstance(child, dict):
            child = node[segment] = dict(child) if isinstance(child, Mapping) else {}
        node = child
    node[path[-1]] = value


def _pop(data: dict[str, Any], path: list[str]) -> None:
    found, parent = _get(data, path[:-1])
    if found and isinstance(parent, dict):
        parent.pop(path[-1], None)


def canonicalize(data: Mapping[str, Any], where: str) -> tuple[dict[str, Any], dict[str, str]]:
    """``data`` with every alias moved to its key (a copy), and which canonical keys
    came from which alias. An alias and its key both given (differently) is refused:
    which one was meant cannot be told."""
    out = _deep_copy(data)
    renamed: dict[str, str] = {}
    for alias, spec in ALIASES.items():
        found, value = _get(out, alias.split("."))
        if not found:
            continue
        _pop(out, alias.split("."))
        try:
            moves = (
                {f"{alias}.{k}": (f"{spec.target}.{k}", v) for k, v in value.items()}
                if isinstance(value, Mapping)
                else {alias: (spec.target, spec.convert(value))}
            )
        except ValueError as exc:
            raise ConveyorError(f"invalid configuration: {alias} in {where}: {exc}") from None
        for shown, (target, converted) in moves.items():
            present, current = _get(out, target.split("."))
            if present and current != converted:
                raise ConveyorError(
                    f"invalid configuration: {shown} and {target} are both set in {where}; "
                    f"they are one setting ({shown} is the seeds' name for it): keep one"
                )
            _set(out, target.split("."), converted)
            renamed[target] = shown
    return out, renamed


def _deep_copy(data: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _deep_copy(v) if isinstance(v, Mapping) else v for k, v in data.items()}


# -- masking -----------------------------------------------------------------------------

# The libpq parameters whose value is a secret: the password, and the passphrase of the
# client key (sslkey). Matched in any case (libpq's own are lower case; masking more is safe).
SECRET_KEYS = ("password", "sslpassword")
# A query parameter of a URL; libpq percent-decodes its keys too (?pass%77ord=x is a
# password), so the key is decoded before it is compared (see _masked_pair).
_QUERY_PAIR = re.compile(r"([?&])([^=&#]*)=([^&#]*)")
# ASCII: libpq separates key=value pairs by ASCII whitespace only.
_CONNINFO_PASSWORD = re.compile(
    rf"(\b(?:{'|'.join(SECRET_KEYS)})\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s']\S*)", re.IGNORECASE | re.ASCII
)


def _masked_pair(match: re.Match[str]) -> str:
    key = unquote(match[2], errors="replace").strip().lower()
    return f"{match[1]}{match[2]}=***" if key in SECRET_KEYS else match[0]


# Between two URLs of a list: a comma followed by a scheme (a comma inside a password or
# a query is not followed by one).
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*")
_URL_LIST_SEP = re.compile(r",(?=\s*[A-Za-z][A-Za-z0-9+.-]*://)")


def split_urls(text: str) -> list[str]:
    """``url1,url2,...`` (the nodes of a RabbitMQ cluster) as a list of URLs."""
    return [u.strip() for u in _URL_LIST_SEP.split(text.strip().rstrip(",")) if u.strip()]


def mask_secrets(text: str) -> str:
    """Hide secrets in a URL (``scheme://user:secret@host``, ``?password=secret``,
    ``?sslpassword=``, a key percent-encoded as ``?pass%77ord=``), a comma-separated list of
    URLs, or a libpq key=value connection string (``password=secret``, quoted or not)."""
    if len(urls := split_urls(text)) > 1:
        return ",".join(mask_secrets(u) for u in urls)
    scheme, sep, rest = text.partition("://")
    if not sep or not _SCHEME.fullmatch(scheme.strip()):  # "password=://x" is a conninfo, not a URL
        return _CONNINFO_PASSWORD.sub(r"\1***", text)
    # The authority ends at the first /, ? or # after the last @ (a password may hold them).
    start = rest.rfind("@") + 1
    cut = min((i for i in (rest.find(c, start) for c in "/?#") if i != -1), default=len(rest))
    authority, tail = rest[:cut], rest[cut:]
    creds, at, hosts = authority.rpartition("@")
    if at:
        user, colon, _ = creds.partition(":")
        authority = f"{user}{':***' if colon else ''}@{hosts}"
    # On the whole URL: an "@" in the query may have made the authority too long.
    return _QUERY_PAIR.sub(_masked_pair, f"{scheme}://{authority}{tail}")
