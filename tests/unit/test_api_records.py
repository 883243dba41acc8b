"""The API's execution bodies are derived from the domain's records (issue #26): the fields
are the records' own, in their order, with the few differences the API shows."""

from __future__ import annotations

import dataclasses

from conveyor.api.schemas import AttemptOut, ExecutionOut, ExecutionSummaryOut
from conveyor.domain.models import Attempt, Execution, ExecutionSummary


def names(record: type) -> list[str]:
    return [f.name for f in dataclasses.fields(record)]


def test_the_api_models_have_the_records_fields_in_order() -> None:
    assert list(AttemptOut.model_fields) == names(Attempt)
    assert list(ExecutionOut.model_fields) == [*names(Execution), "admission"]
    assert list(ExecutionSummaryOut.model_fields) == names(ExecutionSummary)


def test_what_the_api_shows_differently() -> None:
    full = ExecutionOut.model_json_schema()
    assert full["properties"]["status"] == {"title": "Status", "type": "string"}
    assert not {"result", "attempts", "admission", "not_before"} & set(full["required"])
    assert full["properties"]["cancelled_by"]["description"] == "who asked for its cancellation, if anyone did"
    summary = ExecutionSummaryOut.model_json_schema()
    assert summary["description"].startswith("An execution in a list:")
    assert "parameters_preview" in summary["required"]
    assert "result_size" not in summary["required"]
    assert summary["properties"]["parameters_preview"]["description"] == (
        "the first 200 characters of the parameters' JSON text"
    )
