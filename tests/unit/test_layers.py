"""The layers of the floor plan, read from the imports of every module under src/conveyor.

domain/ (the rules) and store/ (the database) sit below everything that runs: they import
no runtime role (executor, worker, transport) and no composition root or adapter (service,
api, cli, sdk, verbs). domain/ holds no database code either (no store/, no psycopg), and
expressions/ does not reach into the store. Every import counts: a lazy one inside a
function, and one under ``TYPE_CHECKING``, tie the layers together all the same.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import conveyor

ROOT = Path(conveyor.__file__).parent
RUNTIME = ("executor", "worker", "api", "cli", "sdk", "service", "verbs", "transport")
# layer -> the packages (or top-level modules) it must not import
RULES: dict[str, tuple[str, ...]] = {
    "store": tuple(f"conveyor.{p}" for p in RUNTIME),
    "domain": (*(f"conveyor.{p}" for p in RUNTIME), "conveyor.store", "psycopg", "psycopg_pool"),
    "expressions": ("conveyor.store",),
}


def module_name(path: Path) -> str:
    parts = ["conveyor", *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> set[str]:
    return imports_in(path.read_text(), module_name(path), is_package=path.name == "__init__.py")


def imports_in(source: str, name: str, *, is_package: bool = False) -> set[str]:
    """Every module the source of module ``name`` imports, dotted and absolute;
    ``from x import y`` counts as both ``x`` and ``x.y`` (y may be a submodule)."""
    package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join([*base, node.module] if node.module else base)
            else:
                source = node.module or ""
            found.add(source)
            found.update(f"{source}.{alias.name}" for alias in node.names)
    return found


def breaks(module: str, forbidden: tuple[str, ...]) -> bool:
    return any(module == f or module.startswith(f + ".") for f in forbidden)


def modules() -> list[Path]:
    return sorted(ROOT.rglob("*.py"))


def test_the_tree_is_read() -> None:
    layers = {module_name(p).split(".")[1] for p in modules() if p.parent != ROOT}
    assert set(RULES) <= layers, "a layer of the rules has no modules: was it renamed?"


@pytest.mark.parametrize("layer", sorted(RULES))
def test_a_layer_imports_nothing_above_it(layer: str) -> None:
    wrong = {
        module_name(path): sorted(m for m in imported(path) if breaks(m, RULES[layer]))
        for path in sorted((ROOT / layer).rglob("*.py"))
    }
    assert {m: names for m, names in wrong.items() if names} == {}


def test_the_import_reader_sees_every_kind_of_import() -> None:
    source = (
        "from __future__ import annotations\n"
        "import psycopg.rows\n"
        "from ..worker import service\n"
        "from . import db\n"
        "from conveyor import api\n"
        "def late() -> None:\n"
        "    from conveyor.cli.main import main\n"
    )
    found = imports_in(source, "conveyor.store.probe")
    assert {"psycopg.rows", "conveyor.worker.service", "conveyor.store.db", "conveyor.api"} <= found
    assert "conveyor.cli.main" in found
    assert "conveyor.store.x" in imports_in("from .x import y", "conveyor.store", is_package=True)
    assert breaks("conveyor.api", RULES["store"])
    assert not breaks("conveyor.apiary", RULES["store"])
