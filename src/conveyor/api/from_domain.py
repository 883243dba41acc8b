"""Response bodies derived from the domain's records (issue #26): a record's fields, types,
defaults and descriptions are written once, on its dataclass in ``conveyor.domain.models``;
the API's model of it is built from them here, so a field added to the record is in the
OpenAPI document without a second list. Only what the API shows differently is said
here: a status as plain text, a default the document has always had, a nested model."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, Field, create_model

_UNSET: Any = object()


def model_of(
    record: type,
    name: str,
    *,
    types: Mapping[str, Any] | None = None,
    defaults: Mapping[str, Any] | None = None,
    extra: Mapping[str, tuple[Any, Any]] | None = None,
    doc: str | None = None,
) -> type[BaseModel]:
    """A pydantic model named ``name`` with the fields of the dataclass ``record`` in its
    order: each field's type (or ``types[field]``), its default (or ``defaults[field]``;
    none: required) and its ``metadata["description"]``; then the ``extra`` fields."""
    hints = typing.get_type_hints(record)
    types, defaults = types or {}, defaults or {}
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(record):
        default = defaults.get(f.name, _UNSET)
        description = f.metadata.get("description")
        if default is _UNSET and f.default_factory is not dataclasses.MISSING:
            info: Any = Field(default_factory=f.default_factory, description=description)
        else:
            if default is _UNSET:
                default = f.default if f.default is not dataclasses.MISSING else ...
            info = Field(default, description=description) if description else default
        fields[f.name] = (types.get(f.name, hints[f.name]), info)
    fields.update(extra or {})
    model: type[BaseModel] = create_model(name, __doc__=doc, __module__=__name__, **fields)
    return model
