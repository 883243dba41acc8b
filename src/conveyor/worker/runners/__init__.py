"""Action runners: each runs one action and returns an ``ActionResult``, never raising except on
cancellation."""

from conveyor.worker.runners.python import run_python
from conveyor.worker.runners.subprocess import run_subprocess

__all__ = ["run_python", "run_subprocess"]
