"""The conductor runs what the language parses: the reference example, end to end."""

from __future__ import annotations

from pathlib import Path

from conveyor.workflows.parse import parse_workflow
from unit.workflows.conductor_kit import Sim, envelope

DOCS = Path(__file__).parents[3] / "docs" / "workflows.md"


def example() -> str:
    text = DOCS.read_text()
    start = text.index("```yaml\nref: ops.deploy")
    return text[start + len("```yaml\n") : text.index("```", start + 8)]


def test_the_reference_example_runs_build_then_unit_and_lint_then_deploys_to_each_host() -> None:
    sim = Sim(parse_workflow(example()))
    step = sim.start(hosts=["h1", "h2", "h3"])
    assert step.context == {"hosts": ["h1", "h2", "h3"], "message": "deployed", "attempts": 0}
    (build,) = step.children
    assert (build.action_ref, build.parameters) == ("core.local", {"cmd": "make build", "timeout": 60})
    step = sim.finish("build", envelope(None, stdout="img:7"))
    assert sorted(sim.names(step)) == ["lint", "unit"]
    assert step.context["artifact"] == "img:7"
    step = sim.finish("lint", envelope(succeeded=False, error="lint"), "failed")
    (retry,) = step.children
    assert (retry.task, retry.retry, retry.delay) == ("lint", 1, 5.0)
    sim.finish("lint", envelope())
    step = sim.finish("unit", envelope())
    assert [(c.index, c.parameters) for c in step.children] == [
        (0, {"hosts": "h1", "cmd": "deploy img:7"}),
        (1, {"hosts": "h2", "cmd": "deploy img:7"}),
    ]
    for index in range(3):
        step = sim.finish("deploy", envelope(f"ok{index}"), index=index)
    assert (step.status, step.output) == ("succeeded", {"artifact": "img:7"})
    assert sim.run("deploy").result == ["ok0", "ok1", "ok2"]


def test_the_reference_example_fails_when_build_fails() -> None:
    sim = Sim(parse_workflow(example()))
    sim.start(hosts=["h1"])
    step = sim.finish("build", envelope(succeeded=False, error="compile error"), "failed")
    assert step.status == "failed"
    assert step.errors[0]["type"] == "fail"
