"""Data passes through a workflow as it is (issue #25, point 4), end to end with the real
executor and worker: a command's output that is not UTF-8 reaches ``result().stdout``
with its encoding flag (the output API's ``{"encoding": "base64", "data"}``), not as bare
base64 text taken for the output; and the shorthand ``cmd='printf "x\\ty\\n"'`` runs with
its backslashes (it ran ``printf "xtyn"``)."""

from __future__ import annotations

import base64
from typing import Any

from psycopg_pool import AsyncConnectionPool

from conveyor.workflows.registration import Definition, prepare
from integration.builders import Conn
from integration.workflows.kit import request
from integration.workflows.test_end_to_end import ended

WORKFLOW = r"""
ref: tests.output
tasks:
  binary:
    action: tests.sh cmd="printf 'a\0b\377'"
    next:
      - when: <% succeeded() %>
        publish:
          - binary: <% result().stdout %>
          - binary_err: <% result().stderr %>
        do: tabbed
  tabbed:
    action: tests.sh cmd='printf "x\ty\n"'
    next:
      - when: <% succeeded() %>
        publish:
          - tabbed: <% result().stdout %>
          - is_text: <% result().stdout = "x\ty\n" %>
output:
  - binary: <% ctx(binary) %>
  - binary_err: <% ctx(binary_err) %>
  - tabbed: <% ctx(tabbed) %>
  - is_text: <% ctx(is_text) %>
"""


async def test_output_and_backslashes_pass_through_a_workflow(conn: Conn, world: AsyncConnectionPool[Any]) -> None:
    known = [r["ref"] for r in conn.execute("SELECT ref FROM action").fetchall()]
    [registration] = prepare([Definition(text=WORKFLOW)], known)
    assert registration.spec.tasks["tabbed"].input == {"cmd": 'printf "x\\ty\\n"'}
    conn.execute("SELECT register_workflow(%(ref)s, %(definition)s, %(source)s, %(description)s, "
                 "%(parameters_schema)s)", registration.params())  # fmt: skip
    done = await ended(conn, request(conn, "tests.output"))
    assert done["status"] == "completed", done["result"]
    output = done["result"]
    assert output["binary"] == {"encoding": "base64", "data": base64.b64encode(b"a\0b\377").decode()}
    assert base64.b64decode(output["binary"]["data"]) == b"a\0b\377"
    assert output["binary_err"] == ""  # UTF-8 output stays text
    assert output["tabbed"] == "x\ty\n"  # printf saw the backslashes: a tab and a newline
    assert output["is_text"] is True
