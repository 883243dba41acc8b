"""Pure unit tests: ``conveyor run --params-file FILE|-`` reads one JSON object, refuses
everything else with one line naming the file, and ``key=value`` pairs override its keys.
No database, no processes."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from conveyor.cli.run import merge_parameters, read_params_file
from conveyor.domain.errors import ConveyorError

LIMIT = 1024
SCHEMA = {"properties": {"message": {"type": "string"}, "seconds": {"type": "number"}}}


def write(tmp_path: Path, content: str | bytes) -> str:
    path = tmp_path / "params.json"
    if isinstance(content, str):
        path.write_text(content, encoding="utf-8")
    else:
        path.write_bytes(content)
    return str(path)


def refused(source: str, stdin: bytes | None = None, limit: int = LIMIT) -> str:
    """The message of the one-line error reading ``source`` raises."""
    with pytest.raises(ConveyorError) as raised:
        read_params_file(source, limit, io.BytesIO(stdin) if stdin is not None else None)
    message = str(raised.value)
    assert "\n" not in message
    return message


def test_a_file_holds_one_object(tmp_path: Path) -> None:
    params = {"message": "a'b\"c $HOME `x`\n", "nested": {"list": [1, 2.5, None, True]}, "ü": "ß"}
    assert read_params_file(write(tmp_path, json.dumps(params)), LIMIT) == params


def test_standard_input_is_dash() -> None:
    stdin = io.BytesIO(b'{"message": "from stdin"}')
    assert read_params_file("-", LIMIT, stdin) == {"message": "from stdin"}


def test_a_byte_order_mark_is_not_an_error(tmp_path: Path) -> None:
    assert read_params_file(write(tmp_path, b'\xef\xbb\xbf{"a": 1}'), LIMIT) == {"a": 1}


def test_the_limit_is_inclusive(tmp_path: Path) -> None:
    body = '{"message": "' + "x" * (LIMIT - 16) + '"}'
    assert len(body) == LIMIT - 1
    assert read_params_file(write(tmp_path, body + " "), LIMIT) == {"message": "x" * (LIMIT - 16)}
    assert "larger than 1024 bytes" in refused(write(tmp_path, body + "  "))
    assert "larger than 1024 bytes" in refused("-", stdin=(body + "  ").encode())


def test_a_missing_file(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.json")
    assert refused(missing) == f"--params-file {missing}: no such file"


def test_a_directory(tmp_path: Path) -> None:
    assert refused(str(tmp_path)) == f"--params-file {tmp_path}: is a directory, not a file"


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ('{"a": 1,\n  "b": }', "not JSON: Expecting value at line 2 column 8"),
        ("", "not JSON: Expecting value at line 1 column 1"),
        ('{"a": 1} {"b": 2}', "not JSON: Extra data at line 1 column 10"),
        ("message=hi", "not JSON: Expecting value at line 1 column 1"),
    ],
)
def test_text_that_is_not_json_says_where(tmp_path: Path, content: str, expected: str) -> None:
    path = write(tmp_path, content)
    assert refused(path) == f"--params-file {path}: {expected}"


@pytest.mark.parametrize(
    ("content", "kind"),
    [("[1, 2]", "an array"), ('"text"', "a string"), ("3", "a number"), ("true", "a boolean"), ("null", "null")],
)
def test_anything_but_an_object_is_refused(content: str, kind: str) -> None:
    message = refused("-", stdin=content.encode())
    assert message.startswith("--params-file standard input: expected a JSON object of parameters")
    assert message.endswith(f"not {kind}")


@pytest.mark.parametrize("content", ['{"a": NaN}', '{"a": [Infinity]}', '{"a": {"b": -Infinity}}', '{"a": 1e400}'])
def test_numbers_json_cannot_carry_are_refused(content: str) -> None:
    assert "is not a number JSON can carry" in refused("-", stdin=content.encode())


def test_text_that_is_not_utf8(tmp_path: Path) -> None:
    path = write(tmp_path, b'{"a": "\xff"}')
    assert refused(path) == f"--params-file {path}: not UTF-8 text (byte 8)"


def test_nesting_too_deep_for_the_parser(tmp_path: Path) -> None:
    depth = 100_000
    path = write(tmp_path, '{"a": ' + "[" * depth + "]" * depth + "}")
    assert refused(path, limit=10 * depth) == (
        f"--params-file {path}: the document has more than 100 levels of nesting (documents.max_depth)"
    )


def test_pairs_override_the_files_keys_whole() -> None:
    from_file = {"message": "from file", "seconds": 5, "opts": {"a": 1, "b": 2}}
    merged = merge_parameters(from_file, ["seconds=1.5", 'opts={"b": 3}', "message=7"], SCHEMA)
    # Typed by the schema as without a file; a nested object is replaced, not merged.
    assert merged == {"message": "7", "seconds": 1.5, "opts": {"b": 3}}
    assert from_file["opts"] == {"a": 1, "b": 2}  # the file's dict is left as it was
    assert merge_parameters(from_file, [], SCHEMA) == from_file
    assert merge_parameters({}, ["message=x"], SCHEMA) == {"message": "x"}
