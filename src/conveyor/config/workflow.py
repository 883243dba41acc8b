"""The ``workflow`` section's bounds on what one top-level workflow may create, in all
(issue #25: a workflow could dispatch without bound). Kept out of config.py, which
inherits them into ``WorkflowSettings``."""

from __future__ import annotations

from pydantic import Field

from conveyor.config.connections import Section


class WorkflowBounds(Section):
    # Generous: a 100,000-item fan-out of sub-workflows of a few tasks each fits.
    max_tree_executions: int = Field(
        1_000_000,
        ge=1,
        le=1_000_000_000,
        description="child executions one top-level workflow and its sub-workflows may request in all "
        "(items, retries and sub-workflows included); more fails the workflow that asked",
    )
    max_tree_tasks: int = Field(
        1_000_000,
        ge=1,
        le=1_000_000_000,
        description="task instances one top-level workflow and its sub-workflows may create in all "
        "(each loop iteration one); more fails the workflow that asked",
    )
