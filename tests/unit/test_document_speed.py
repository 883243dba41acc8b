"""Unit: what reading a user's document costs in CPU before it is refused (issue #25,
point 1, follow-up). A written-out document has no alias to refuse early: each of its
values is parsed before the node bound is passed. With PyYAML's pure-Python parser and
``documents.max_nodes`` at 1,000,000, a 2 MB list of a million values (under the API's
10 MiB body limit) took 21-50 s of CPU to refuse. libyaml's parser feeds the counting
composer: the same list is refused after about 6 s, and 100,000 values are read in under a
second. The figures are printed (``-s``)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from conveyor.domain import documents
from conveyor.domain.documents import (
    DEFAULT_LIMITS,
    DocumentError,
    Limits,
    PureBoundedLoader,
    check,
    load_json,
    load_yaml,
)
from conveyor.workflows.parse import parse_workflow
from conveyor.workflows.problems import WorkflowError

_CPU = textwrap.dedent(
    """
    import resource, sys
    sys.path[:0] = [{tests!r}]
    from support.documents import bomb
    from conveyor.domain.documents import DocumentError, load_yaml

    def cpu():
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    texts = {{"99,999 values": "[" + ",".join(["1"] * 99_999) + "]",
             "1,000,001 values": "[" + ",".join(["1"] * 1_000_001) + "]",
             "7-level bomb": bomb(7)}}
    for name, text in texts.items():
        started = cpu()
        try:
            load_yaml(text)
            outcome = "read"
        except DocumentError:
            outcome = "refused"
        print(name.replace(" ", "_"), len(text), outcome, cpu() - started)
    """
)


def test_a_written_out_document_costs_a_bounded_cpu_time() -> None:
    """CPU time (not wall time: the machine is shared) in a fresh interpreter."""
    script = _CPU.format(tests=str(Path(__file__).parent.parent))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=True)
    rows = {
        name: (int(size), outcome, float(cpu)) for name, size, outcome, cpu in map(str.split, out.stdout.splitlines())
    }
    for name, (size, outcome, cpu) in rows.items():
        print(f"\n{name.replace('_', ' ')} ({size:,} bytes): {outcome} after {cpu:.2f} s of CPU", end="")
    assert rows["99,999_values"][1] == "read"
    assert rows["1,000,001_values"][1] == "refused"
    assert rows["7-level_bomb"][1] == "refused"
    # libyaml under the counting composer, measured: 0.6-1.0 s and 6.2 s; PyYAML's pure parser
    # took 2.3 s and 21 s. The million is the figure that tells them apart; slack for a loaded machine.
    assert rows["99,999_values"][2] < 2.5
    assert rows["1,000,001_values"][2] < 12.0
    assert rows["7-level_bomb"][2] < 0.5


def test_libyaml_parses_when_pyyaml_has_it() -> None:
    assert yaml.__with_libyaml__, "PyYAML without libyaml: documents are read 4x slower"
    assert documents.BoundedLoader is documents.CBoundedLoader


def test_the_default_node_bound_lets_a_100000_item_input_through() -> None:
    """The bound covers JSON bodies too: a 100,000-item list as a workflow's input (a fan-out that
    works) must pass; one value more than the bound is refused, naming the setting."""
    body = json.dumps({"action": "fanout", "parameters": {"items": list(range(100_000))}})
    assert len(load_json(body)["parameters"]["items"]) == 100_000
    assert DEFAULT_LIMITS.max_nodes == 1_000_000
    text = "[" + ",".join(["1"] * 1_000_000) + "]"  # 1,000,001 values with the list
    with pytest.raises(DocumentError, match=r"more than 1000000 nodes \(aliases expanded\) \(documents.max_nodes\)"):
        load_yaml(text)


SAMPLES = [
    "a: 1\nb: [x, {c: d}]\n",
    "b: &b {x: 1, y: 2}\nc: {<<: *b, x: 3}\n",
    "x: 1\nx: 2\n",
    "1: a\n'1': b\n",
    "&a [*a]",
    "[" * 101 + "]" * 101,
    "a: &a x\nb: [*a, *a, *a]",
    'a: "\\x00"',
    "a: 2024-01-02\nb: 1.5\nc: ~\nd: yes\n",
    "- !!binary aGk=\n",
]


def _outcome(read: object) -> object:
    try:
        return ("value", read())  # type: ignore[operator]
    except DocumentError as exc:
        return ("refused", str(exc))


@pytest.mark.parametrize("text", SAMPLES)
def test_both_parsers_read_and_refuse_alike(text: str) -> None:
    """libyaml's events and PyYAML's own go through one composer: the same values, the
    same refusals (only syntax errors are worded by each parser)."""
    limits = Limits(max_aliases=2)

    def pure() -> object:
        loader = PureBoundedLoader(text, limits)
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()

    assert _outcome(lambda: load_yaml(text, limits)) == _outcome(pure)


def test_what_libyaml_cannot_take_is_read_as_before() -> None:
    """A ``"\\ud800"`` escape (libyaml refuses it as a syntax error) is read by the pure
    parser, so that the bad-input check names its path; a lone surrogate in the text
    itself (libyaml cannot even be given it) is PyYAML's one-line reader error."""
    assert load_yaml('a: "\\ud800"') == {"a": "\ud800"}
    with pytest.raises(yaml.YAMLError, match="unacceptable character #xd800"):
        load_yaml("a: \ud800")
    with pytest.raises(WorkflowError, match="YAML syntax error: unacceptable character #xd800"):
        parse_workflow("ref: a.b\ndescription: \ud800\n")


def test_keys_count_as_values_in_json_as_in_yaml() -> None:
    """docs/configuration.md: keys count as values. 600 keys and their 600 values and the
    object: 1,201 values, past a bound of 1,000 whichever way it is written (JSON counted
    601 before: the keys only toward max_bytes)."""
    document = {f"k{n}": n for n in range(600)}
    limits = Limits(max_nodes=1000)
    for read in (load_json, load_yaml):
        with pytest.raises(DocumentError, match=r"more than 1000 nodes"):
            read(json.dumps(document), limits)
    with pytest.raises(DocumentError, match=r"more than 1000 nodes"):
        check(document, limits)
    smaller = {f"k{n}": n for n in range(499)}  # 999 values
    assert load_json(json.dumps(smaller), limits) == load_yaml(json.dumps(smaller), limits) == smaller
