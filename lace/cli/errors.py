"""The CLI's error hierarchy: what ``main`` prints as ``error: <message>`` (+ ``hint:``) and exits with.

Commands raise CliError subclasses; store errors are translated by ``from_store_error`` so no library
exception reaches the user.
"""

from __future__ import annotations

from lace.cli.status import ExitStatus
from lace.store import errors as store_errors


class CliError(Exception):
    """A failure a user can meet: a one-line message, an exit status, an optional hint."""

    status = ExitStatus.ERROR

    def __init__(self, message: str, status: ExitStatus | None = None, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        if status is not None:
            self.status = status

    def __str__(self) -> str:
        return self.message


class UsageError(CliError):
    """The command line is wrong."""

    status = ExitStatus.USAGE


class NotFoundError(CliError):
    """The object, kind, file or lab named does not exist."""

    status = ExitStatus.NOT_FOUND


class ConflictError(CliError):
    """The object changed underneath, or its name is taken."""

    status = ExitStatus.CONFLICT


class UnavailableError(CliError):
    """No lab is running, or the store or agent cannot be reached."""

    status = ExitStatus.UNAVAILABLE


class InvalidInputError(CliError):
    """A manifest or argument was rejected; nothing was written."""

    status = ExitStatus.INVALID


class ForbiddenError(CliError):
    """A rule refused the operation."""

    status = ExitStatus.FORBIDDEN


_STATUS_BY_STORE_ERROR: tuple[tuple[type[store_errors.StoreError], type[CliError]], ...] = (
    (store_errors.ValidationError, InvalidInputError),
    (store_errors.UnknownKind, NotFoundError),
    (store_errors.NotFound, NotFoundError),
    (store_errors.AlreadyExists, ConflictError),
    (store_errors.Conflict, ConflictError),
    (store_errors.Forbidden, ForbiddenError),
    (store_errors.Unavailable, UnavailableError),
    (store_errors.Gone, UnavailableError),
)


def from_store_error(err: store_errors.StoreError, prefix: str | None = None) -> CliError:
    """The CliError a store error becomes (same message and hint, mapped exit status)."""
    cls: type[CliError] = CliError
    for store_cls, cli_cls in _STATUS_BY_STORE_ERROR:
        if isinstance(err, store_cls):
            cls = cli_cls
            break
    message = f"{prefix}: {err.message}" if prefix else err.message
    return cls(message, hint=err.hint)
