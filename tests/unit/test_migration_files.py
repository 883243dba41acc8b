"""The migration files' headers: what each declares about the code that may run on it."""

from __future__ import annotations

from conveyor.store.migrate import Migration, known_migrations


def test_a_header_declares_the_oldest_compatible_version() -> None:
    expand = Migration(40, "x", "-- compatible-from: 38\n-- why\nALTER TABLE t ADD COLUMN c int;\n")
    assert expand.compatible_from == 38


def test_no_header_means_the_migration_itself() -> None:
    assert Migration(40, "x", "-- a contract migration\nALTER TABLE t DROP COLUMN c;\n").compatible_from == 40


def test_only_the_leading_comment_block_counts() -> None:
    """A line deep in a function body is not a declaration."""
    text = "-- why\n\nCREATE FUNCTION f() RETURNS int LANGUAGE sql AS $$\n-- compatible-from: 1\nSELECT 1 $$;\n"
    assert Migration(40, "x", text).compatible_from == 40


def test_every_shipped_declaration_is_in_range() -> None:
    for m in known_migrations():
        assert 1 <= m.compatible_from <= m.version, m.name
