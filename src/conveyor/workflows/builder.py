"""Workflows defined in Python, for shops that keep their automation in code.

The builder writes the same document a YAML file holds and loads it through the same
reader (:func:`conveyor.workflows.parse.load_workflow`), so a built workflow is exactly
what the equivalent YAML gives, with the same problems reported the same way, and
:meth:`Workflow.to_yaml` can be registered like any file::

    wf = Workflow("ops.deploy", input=["host", ("retries", 3)])
    build = wf.task("build", action="ops.build", input={"host": "<% ctx(host) %>"})
    build.on(when="<% succeeded() %>", do=["test"], publish={"image": "<% result().image %>"})
    wf.task("test", action="ops.test", retry={"count": 2, "delay": 5})
    wf.output(image="<% ctx(image) %>")
    spec = wf.spec()
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from conveyor.workflows.parse import load_workflow
from conveyor.workflows.spec import Join, WorkflowSpec

InputDecl = str | tuple[str, Any]


class TaskBuilder:
    """One task of a :class:`Workflow`; :meth:`on` adds its transitions in order."""

    def __init__(self, name: str, body: dict[str, Any]) -> None:
        self.name = name
        self._body = body

    def on(
        self,
        *,
        when: str | None = None,
        do: str | Sequence[str] = (),
        publish: Mapping[str, Any] | None = None,
    ) -> TaskBuilder:
        """Add a transition: when ``when`` holds (always if None), publish, then ``do``."""
        transition: dict[str, Any] = {}
        if when is not None:
            transition["when"] = when
        if publish:
            transition["publish"] = [{k: v} for k, v in publish.items()]
        transition["do"] = [do] if isinstance(do, str) else list(do)
        self._body.setdefault("next", []).append(transition)
        return self


class Workflow:
    """A workflow under construction; :meth:`spec` gives its :class:`WorkflowSpec`."""

    def __init__(
        self,
        ref: str,
        *,
        input: Sequence[InputDecl] = (),
        description: str = "",
        vars: Mapping[str, Any] | None = None,
        parameters: Mapping[str, Any] | None = None,
        version: str = "1.0",
        timeout: float | None = None,
    ) -> None:
        self._doc: dict[str, Any] = {"ref": ref, "version": version}
        if timeout is not None:
            self._doc["timeout"] = timeout
        if description:
            self._doc["description"] = description
        if input:
            self._doc["input"] = [i if isinstance(i, str) else {i[0]: i[1]} for i in input]
        if parameters is not None:
            self._doc["parameters"] = dict(parameters)
        if vars:
            self._doc["vars"] = [{k: v} for k, v in vars.items()]
        self._tasks: dict[str, Any] = {}
        self._doc["tasks"] = self._tasks

    def task(
        self,
        name: str,
        action: str | None = None,
        *,
        input: Mapping[str, Any] | None = None,
        items: str | list[Any] | None = None,
        concurrency: int | str | None = None,
        join: Join = None,
        retry: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        delay: float | None = None,
    ) -> TaskBuilder:
        """Add a task. ``items`` is ``with``'s list or expression (``"x in <% ... %>"``
        allowed); ``retry`` takes the keys of YAML's ``retry`` (when, count, delay,
        backoff, max_delay)."""
        if name in self._tasks:
            raise ValueError(f"task {name!r} is defined twice")
        body: dict[str, Any] = {}
        if action is not None:
            body["action"] = action
        if input:
            body["input"] = dict(input)
        if items is not None:
            body["with"] = {"items": items} if concurrency is None else {"items": items, "concurrency": concurrency}
        for key, value in (("join", join), ("retry", retry), ("timeout", timeout), ("delay", delay)):
            if value is not None:
                body[key] = dict(value) if isinstance(value, Mapping) else value
        self._tasks[name] = body
        return TaskBuilder(name, body)

    def output(self, **values: Any) -> Workflow:
        """Add outputs (in order): ``wf.output(image="<% ctx(image) %>")``."""
        self._doc.setdefault("output", []).extend({k: v} for k, v in values.items())
        return self

    def document(self) -> dict[str, Any]:
        """The YAML document this workflow is (a deep copy: later changes do not leak)."""
        loaded: dict[str, Any] = yaml.safe_load(self.to_yaml())
        return loaded

    def to_yaml(self) -> str:
        return yaml.safe_dump(self._doc, sort_keys=False, allow_unicode=True)

    def spec(self) -> WorkflowSpec:
        """The workflow, read like a YAML file (raises the same WorkflowError)."""
        return load_workflow(self.document())
