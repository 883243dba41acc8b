"""Fixtures of the transport tests: each runs on the PostgreSQL transport and on the
RabbitMQ transport (``transport_kind``, tests/conftest.py), with the database publishing
for the transport under test and that transport's settings."""

from __future__ import annotations

import pytest

from conveyor.config import Settings
from integration.transport_kit import declare_route, transport_settings


@pytest.fixture(autouse=True)
def route(transport_kind: str, db_url: str) -> None:
    declare_route(transport_kind, db_url)


@pytest.fixture
def settings(transport_kind: str, request: pytest.FixtureRequest) -> Settings:
    return transport_settings(transport_kind, request)
