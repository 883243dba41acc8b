"""Errors a user can act on. Their messages are shown as they are, without a traceback."""

from __future__ import annotations


class ConveyorError(Exception):
    """Base class: the message is meant for the person at the terminal."""


class ConflictError(ConveyorError):
    """A valid request that the resource's current state does not allow."""


class NotFoundError(ConveyorError):
    """The thing asked for does not exist."""


class ForbiddenError(ConveyorError):
    """The caller is known but may not do this (e.g. answer an inquiry not assigned to it)."""


class InvalidAnswerError(ConveyorError):
    """An inquiry's answer that its schema refuses; ``problems`` are (path, message)."""

    def __init__(self, inquiry_id: int, problems: list[tuple[str, str]]) -> None:
        text = "; ".join(f"{path}: {message}" for path, message in problems)
        super().__init__(f"invalid answer for inquiry {inquiry_id}: {text}")
        self.inquiry_id = inquiry_id
        self.problems = problems


class InvalidPolicyError(ConveyorError):
    """An admission policy (or its target) that cannot be stored; the message says why."""


class UnknownActionError(ConveyorError):
    def __init__(self, ref: str) -> None:
        super().__init__(f"unknown action {ref!r}: no worker has registered it (see `conveyor actions list`)")
        self.ref = ref


class InvalidParametersError(ConveyorError):
    def __init__(self, ref: str, problems: list[str]) -> None:
        super().__init__(f"invalid parameters for {ref}: " + "; ".join(problems))
        self.ref = ref
        self.problems = problems


class ExecutionNotFoundError(ConveyorError):
    def __init__(self, execution_id: int) -> None:
        super().__init__(f"no execution with id {execution_id}")
        self.execution_id = execution_id


class SchemaTooNewError(ConveyorError):
    """The database was migrated by a newer Conveyor; running against it could corrupt it."""


class DatabaseUnavailableError(ConveyorError):
    pass


class InvalidWorkflowError(ConveyorError):
    """A workflow registration refused, with every problem found: ``problems`` are
    (where, path, message), ``where`` naming the file (empty for a single definition),
    ``path`` the spot in the definition (``tasks.deploy.next[0].do``; empty: the whole)."""

    def __init__(self, problems: list[tuple[str, str, str]]) -> None:
        self.problems = problems
        super().__init__(f"invalid workflow definition ({len(problems)} problem(s)): " + "; ".join(self.lines()))

    def lines(self) -> list[str]:
        """One line per problem, for a terminal."""
        return [": ".join(part for part in problem if part) for problem in self.problems]


class InvalidPayloadError(ConveyorError):
    """An event's payload does not satisfy its trigger's schema."""

    def __init__(self, trigger: str, problems: list[str]) -> None:
        super().__init__(f"invalid payload for trigger {trigger}: " + "; ".join(problems))
        self.trigger = trigger
        self.problems = problems


class InvalidRuleError(ConveyorError):
    """A rule registration refused, with every problem found: ``problems`` are (where,
    path, message) as for :class:`InvalidWorkflowError` (``criteria.trigger.x.pattern``)."""

    def __init__(self, problems: list[tuple[str, str, str]]) -> None:
        self.problems = problems
        super().__init__(f"invalid rule ({len(problems)} problem(s)): " + "; ".join(self.lines()))

    def lines(self) -> list[str]:
        return [": ".join(part for part in problem if part) for problem in self.problems]


class InvalidTriggerError(ConveyorError):
    """A trigger that cannot be registered (its name, or a payload schema that is not a
    valid JSON Schema); the message says why."""
