"""Workflows built in Python are the same model as the equivalent YAML."""

from __future__ import annotations

import pytest

from conveyor.workflows.builder import Workflow
from conveyor.workflows.parse import WorkflowError, parse_workflow

YAML = """
ref: ops.deploy
version: "1.0"
description: Build, test, deploy.
input:
  - host
  - retries: 3
vars:
  - tries: 0
tasks:
  build:
    action: ops.build
    input: {host: <% ctx(host) %>}
    next:
      - when: <% succeeded() %>
        publish: [{image: <% result().image %>}]
        do: [test, scan]
      - when: <% failed() %>
        do: fail
  test:
    action: ops.test
    retry: {count: <% ctx(retries) %>, delay: 5, backoff: 2}
    next: [{do: ship}]
  scan:
    action: ops.scan
    timeout: 60
    next: [{do: ship}]
  ship:
    action: ops.ship
    join: all
    with: {items: "h in <% ctx(hosts) %>", concurrency: 5}
output:
  - image: <% ctx(image) %>
"""


def _built() -> Workflow:
    wf = Workflow("ops.deploy", input=["host", ("retries", 3)], description="Build, test, deploy.", vars={"tries": 0})
    build = wf.task("build", action="ops.build", input={"host": "<% ctx(host) %>"})
    build.on(when="<% succeeded() %>", do=["test", "scan"], publish={"image": "<% result().image %>"})
    build.on(when="<% failed() %>", do="fail")
    wf.task("test", action="ops.test", retry={"count": "<% ctx(retries) %>", "delay": 5, "backoff": 2}).on(do="ship")
    wf.task("scan", action="ops.scan", timeout=60).on(do="ship")
    wf.task("ship", action="ops.ship", join="all", items="h in <% ctx(hosts) %>", concurrency=5)
    wf.output(image="<% ctx(image) %>")
    return wf


def test_builder_gives_the_same_spec_as_the_yaml() -> None:
    assert _built().spec() == parse_workflow(YAML)


def test_builder_yaml_registers_through_the_same_reader() -> None:
    wf = _built()
    assert parse_workflow(wf.to_yaml()) == wf.spec()


def test_builder_problems_are_the_yaml_problems() -> None:
    wf = Workflow("ops.bad")
    wf.task("a", action="not a ref", join=0)
    with pytest.raises(WorkflowError) as caught:
        wf.spec()
    assert [p.path for p in caught.value.problems] == ["tasks.a.action", "tasks.a.join"]


def test_a_task_defined_twice_is_refused_at_once() -> None:
    wf = Workflow("ops.x")
    wf.task("a", action="core.noop")
    with pytest.raises(ValueError, match="defined twice"):
        wf.task("a", action="core.noop")
