"""The ids of stored rows, as every door checks them before asking the database.

Ids are ``bigint`` identities, always positive. A door (an API path or query parameter, a
CLI argument, a dashboard URL, a message off the broker) refuses a number outside
``1..MAX_ID`` itself: passed on, it would overflow ``bigint`` and come back as a server
error, not as "no such row". 2**62 (not 2**63 - 1) leaves room to add to an id in SQL.
"""

from __future__ import annotations

MAX_ID = 2**62


def is_id(value: object) -> bool:
    """An int (not a bool) that can be a stored row's id."""
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_ID


def parse_id(text: str) -> int | None:
    """``text`` as an id, or None: ASCII digits only (``"²".isdigit()`` is true and
    ``int()`` refuses it), within 1..MAX_ID. Leading zeros are allowed ("007" is 7); past
    them, more than 20 digits is out of range without asking ``int()`` (which refuses over
    4300 digits)."""
    if not (text.isascii() and text.isdigit()) or len(text.lstrip("0")) > 20:
        return None
    value = int(text)
    return value if 1 <= value <= MAX_ID else None
