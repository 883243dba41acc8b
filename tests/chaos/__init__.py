"""The chaos suite: real executors and workers, random SIGKILLs, a PostgreSQL and a
RabbitMQ restart, duplicate messages; then checks over what the database recorded.
See docs/chaos.md. ``python -m tests.chaos --help`` runs a soak."""

from __future__ import annotations

import sys
from pathlib import Path

# The suite uses the acceptance helpers (``acceptance.helpers``, ``acceptance.pg``), which
# pytest finds through tests/ on sys.path; ``python -m tests.chaos`` needs the same.
_TESTS = str(Path(__file__).resolve().parent.parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)
