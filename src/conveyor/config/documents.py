"""The ``documents`` section: bounds on every document a user sends (workflow and rule
YAML, JSON bodies, payloads, the CLI's files), read by conveyor.domain.documents. Apart
from config.py so that each stays readable; config.py holds it as a section."""

from __future__ import annotations

from pydantic import Field

from conveyor.config.connections import Section
from conveyor.domain.documents import DEFAULT_LIMITS, Limits


class DocumentSettings(Section):
    max_depth: int = Field(
        DEFAULT_LIMITS.max_depth,
        ge=1,
        le=500,  # Python's recursion limit (1000) bounds what a reader can walk
        description="deepest nesting of mappings and sequences in a document a user sends",
    )
    max_nodes: int = Field(
        DEFAULT_LIMITS.max_nodes,
        ge=1000,
        description="most values (scalars, mappings, sequences) in one document, YAML aliases expanded",
    )
    max_aliases: int = Field(DEFAULT_LIMITS.max_aliases, ge=0, description="most YAML aliases (*name) in one document")
    max_bytes: int = Field(
        DEFAULT_LIMITS.max_bytes,
        ge=1024,
        description="most characters of text (keys and scalars) in one document, YAML aliases expanded",
    )

    def limits(self) -> Limits:
        return Limits(self.max_depth, self.max_nodes, self.max_aliases, self.max_bytes)
