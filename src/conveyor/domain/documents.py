"""Reading a document a user sent (YAML or JSON) without letting a few bytes become a
large value: every door that takes one from a user (workflows, rules, triggers,
schedules, webhooks, event payloads, inquiry answers, the CLI's files) reads it here.

YAML aliases share a node: ``&l1 [x, x]``, ``&l2 [*l1, *l1]``, ... nine levels of nine
are a few hundred bytes of text and billions of items once turned into JSON (which is how
a definition is stored). The loader counts while it composes, before anything is
constructed or expanded: each node's expanded weight (nodes, scalar characters, height)
is known when it is finished, an alias adds its anchor's weight, and the document is
refused the moment a bound is passed. A mapping that names a key twice is refused too
(YAML and JSON both let the last one win silently: two tasks named ``a`` lost the first).

The events come from libyaml's C parser when PyYAML has it (``yaml.__with_libyaml__``),
else from PyYAML's pure-Python one: composing stays Python (that is where the counting is),
but the C parser makes reading a written-out document about four times cheaper in CPU
(a user's 2 MB list of a million values took 21 s of CPU to refuse, pure Python).

JSON has no aliases, so it is never larger than its text; it is still bounded in depth
(Python's parser gives up with a RecursionError about 1000 levels deep, and what comes
after recurses too) and in nodes (keys count as values, as in YAML), and refused with
the same one-line messages.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.error import MarkedYAMLError
from yaml.nodes import MappingNode, Node, ScalarNode
from yaml.resolver import Resolver

from conveyor.domain import jsontext

_MERGE = "tag:yaml.org,2002:merge"


@dataclass(frozen=True, slots=True)
class Limits:
    """The bounds of one document (settings ``documents.*``, docs/configuration.md).

    Set so that a document never expands beyond what could have been sent written out in
    full within ``api.max_body_bytes``, and far above real workflows and rules."""

    max_depth: int = 100  # nesting of mappings and sequences
    max_nodes: int = 1_000_000  # scalars (keys too), mappings and sequences, aliases expanded
    max_aliases: int = 10_000  # *name references
    max_bytes: int = 10 * 1024 * 1024  # characters of the scalars, aliases expanded


DEFAULT_LIMITS = Limits()


class DocumentError(ValueError):
    """A document refused before it was expanded: one line saying which bound or key
    (``setting``: the bound's name, ``max_nodes``, ...; None for a key named twice)."""

    def __init__(self, message: str, setting: str | None = None) -> None:
        super().__init__(message)
        self.setting = setting


def _over(what: str, limit: int, setting: str) -> DocumentError:
    return DocumentError(f"the document has more than {limit} {what} (documents.{setting})", setting)


class _Weight:
    """A running count of the expanded document."""

    __slots__ = ("bytes", "nodes")

    def __init__(self) -> None:
        self.nodes = 0
        self.bytes = 0


class _Counting(Composer):
    """The composer that counts while composing and refuses duplicate keys, over either
    parser (:class:`PureBoundedLoader`, :class:`CBoundedLoader`)."""

    if TYPE_CHECKING:  # from the parser and the constructor it is mixed with

        def peek_event(self) -> Any: ...
        def construct_object(self, node: Any, deep: bool = False) -> Any: ...
        def get_single_data(self) -> Any: ...
        def dispose(self) -> None: ...

    def _start(self, limits: Limits) -> None:
        self.limits = limits
        self.total = _Weight()
        self.aliases = 0
        self.depth = 0  # of the node being composed
        self.heights: list[int] = [0]  # the tallest child seen so far, per open collection
        # An anchored node's expanded (nodes, bytes, height), once it is complete. Keyed by
        # id(): the nodes live in the document being composed, so ids are not reused.
        self.weights: dict[int, tuple[int, int, int]] = {}

    def _add(self, nodes: int, size: int, height: int) -> None:
        total, limits = self.total, self.limits
        total.nodes += nodes
        total.bytes += size
        if total.nodes > limits.max_nodes:
            raise _over("nodes (aliases expanded)", limits.max_nodes, "max_nodes")
        if total.bytes > limits.max_bytes:
            raise _over("characters of text (aliases expanded)", limits.max_bytes, "max_bytes")
        if self.depth + height > limits.max_depth:
            raise _over("levels of nesting", limits.max_depth, "max_depth")
        self.heights[-1] = max(self.heights[-1], height)

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            self.aliases += 1
            if self.aliases > self.limits.max_aliases:
                raise _over("aliases", self.limits.max_aliases, "max_aliases")
            node = self.anchors.get(event.anchor)  # an unknown one: the composer's own error
            if node is not None:
                weight = self.weights.get(id(node))
                if weight is None:  # still open: `&a [*a]` is an infinite document
                    line = event.start_mark.line + 1 if event.start_mark else 0
                    raise DocumentError(f"the alias *{event.anchor} at line {line} is inside its own anchor")
                self._add(*weight)
            return super().compose_node(parent, index)
        self.depth += 1
        if self.depth > self.limits.max_depth:
            raise _over("levels of nesting", self.limits.max_depth, "max_depth")
        self.heights.append(0)
        before_nodes, before_bytes = self.total.nodes, self.total.bytes
        node = super().compose_node(parent, index)
        height = self.heights.pop() + 1
        self.depth -= 1
        assert node is not None
        self._add(1, len(node.value) if isinstance(node, ScalarNode) else 0, height)
        if getattr(event, "anchor", None) is not None:
            self.weights[id(node)] = (self.total.nodes - before_nodes, self.total.bytes - before_bytes, height)
        return node

    def compose_mapping_node(self, anchor: Any) -> MappingNode:
        node: MappingNode = super().compose_mapping_node(anchor)
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            # A merge (`<<: *base`) brings keys that the mapping may override: not duplicates.
            if not isinstance(key_node, ScalarNode) or key_node.tag == _MERGE:
                continue
            key = self.construct_object(key_node)
            line = key_node.start_mark.line + 1
            # Twice as a Python key (1 and true: one dict entry) or as the JSON key it is
            # stored as (1 and "1"): either way the last would silently win.
            first = seen.get(key) or seen.get((_JSON_KEY, _json_key(key)))
            if first is not None:
                raise DocumentError(f"duplicate key {key!r} at line {line} (first at line {first})")
            seen[key] = seen[(_JSON_KEY, _json_key(key))] = line
        return node


class PureBoundedLoader(_Counting, yaml.SafeLoader):
    """``yaml.SafeLoader`` (pure-Python parser) that counts while composing."""

    def __init__(self, stream: str | bytes, limits: Limits = DEFAULT_LIMITS) -> None:
        yaml.SafeLoader.__init__(self, stream)
        self._start(limits)


if yaml.__with_libyaml__:
    from yaml._yaml import CParser

    class CBoundedLoader(_Counting, CParser, SafeConstructor, Resolver):
        """libyaml's parser, this module's composer (before CParser's own, which counts
        nothing), PyYAML's safe constructor: ``yaml.CSafeLoader`` that counts."""

        def __init__(self, stream: str | bytes, limits: Limits = DEFAULT_LIMITS) -> None:
            CParser.__init__(self, stream)  # a str with a lone surrogate: UnicodeEncodeError
            Composer.__init__(self)
            SafeConstructor.__init__(self)
            Resolver.__init__(self)
            self._start(limits)

    BoundedLoader: type[_Counting] = CBoundedLoader
else:  # pragma: no cover - PyYAML built without libyaml
    BoundedLoader = PureBoundedLoader


_JSON_KEY = object()  # tags the JSON spelling of a key in ``seen``, apart from the keys themselves


def _json_key(key: Any) -> str:
    """The key ``key`` becomes in the JSON a document is stored as (``1`` and ``"1"``
    become one)."""
    if isinstance(key, str):
        return key
    if key is None or isinstance(key, bool | int | float):
        return json.dumps(key)  # as json.dumps writes a key: 1 -> "1", True -> "true"
    return str(key)  # a date: as the readers turn it into text (default=str)


def load_yaml(text: str | bytes, limits: Limits = DEFAULT_LIMITS) -> Any:
    """The one document in ``text`` (YAML, or JSON which is YAML), refused with
    :class:`DocumentError` past ``limits`` or with a duplicate key; ``yaml.YAMLError`` when
    it is not YAML."""
    return _load(BoundedLoader, text, limits)


def _load(loader_class: type[_Counting], text: str | bytes, limits: Limits) -> Any:
    """Read with ``loader_class`` (libyaml's parser when there is one); with the pure one
    where libyaml refuses what PyYAML reads and the bad-input checks then name (the path of
    a ``"\\ud800"`` escape, domain/storable.py), or cannot take the text at all (a lone
    surrogate in a ``str``: the pure reader refuses it at once with its position). The
    second reading is bounded by the same ``limits``."""
    try:
        loader = loader_class(text, limits)  # type: ignore[call-arg]
    except UnicodeEncodeError:
        loader = PureBoundedLoader(text, limits)
    try:
        return loader.get_single_data()
    except MarkedYAMLError as exc:
        if loader_class is PureBoundedLoader or exc.problem != "found invalid Unicode character escape code":
            raise
    finally:
        loader.dispose()
    return _load(PureBoundedLoader, text, limits)


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    value = dict(pairs)
    if len(value) != len(pairs):
        seen: set[str] = set()
        key = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise DocumentError(f"duplicate key {key!r} in a JSON object")
    return value


def load_json(text: str | bytes, limits: Limits = DEFAULT_LIMITS) -> Any:
    """The JSON value of ``text``, as strict as :func:`jsontext.loads` (``NotFinite``,
    ``json.JSONDecodeError``), refused with :class:`DocumentError` past ``limits`` or with a
    duplicate key."""
    try:
        value = json.loads(
            text,
            parse_constant=jsontext.no_constant,
            parse_float=jsontext.finite_float,
            object_pairs_hook=_pairs,
        )
    except RecursionError:
        raise _over("levels of nesting", limits.max_depth, "max_depth") from None
    check(value, limits)
    return value


def _children(value: Any) -> Iterator[Any]:
    if isinstance(value, dict):
        yield from value.values()
    elif isinstance(value, list | tuple):
        yield from value


def check(value: Any, limits: Limits = DEFAULT_LIMITS) -> None:
    """Refuse an already-decoded JSON value past ``limits`` (without recursion: the value
    may be as deep as the parser allowed)."""
    nodes, size = 0, 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        nodes += 1
        if nodes > limits.max_nodes:
            raise _over("nodes", limits.max_nodes, "max_nodes")
        if depth > limits.max_depth:
            raise _over("levels of nesting", limits.max_depth, "max_depth")
        if isinstance(item, str):
            size += len(item)
        elif isinstance(item, dict):
            size += sum(len(k) for k in item if isinstance(k, str))
            nodes += len(item)  # a key is a value, as a YAML mapping's key is a node
            if nodes > limits.max_nodes:
                raise _over("nodes", limits.max_nodes, "max_nodes")
        if size > limits.max_bytes:
            raise _over("characters of text", limits.max_bytes, "max_bytes")
        stack.extend((child, depth + 1) for child in _children(item))
