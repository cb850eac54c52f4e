"""The store's error hierarchy: every failure a caller can meet, shaped like Kubernetes API statuses.

Each error carries an HTTP-like ``code`` (404, 409, 410, 422, ...) so a Kubernetes-backed store can
raise the same types, and a message that names the object and says what to do. Library exceptions
(sqlite3, jsonschema) never leave the store: they are translated into these.
"""

from __future__ import annotations


class StoreError(Exception):
    """Base of every store error; ``str(err)`` is a complete one-line message for a user."""

    code = 500
    reason = "InternalError"

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class NotFound(StoreError):
    """The object (or kind) does not exist (404)."""

    code = 404
    reason = "NotFound"


class AlreadyExists(StoreError):
    """create() of an object whose name is taken (409)."""

    code = 409
    reason = "AlreadyExists"


class Conflict(StoreError):
    """An update carried a stale metadata.resourceVersion (409): re-read and retry."""

    code = 409
    reason = "Conflict"


class Gone(StoreError):
    """A watch asked for a revision that was compacted away (410): relist, then watch again."""

    code = 410
    reason = "Expired"


class Forbidden(StoreError):
    """The operation is refused by a store rule, e.g. deleting a Network still in use (403)."""

    code = 403
    reason = "Forbidden"


class Exhausted(StoreError):
    """An allocator (network IDs, segment IDs, IP blocks, addresses) has nothing left to give (507)."""

    code = 507
    reason = "InsufficientStorage"


class IpamExhausted(Exhausted):
    """No address left for a pod: the message names the network, the node and the usage."""


class Unavailable(StoreError):
    """The store cannot be reached or stayed locked past the busy timeout (503)."""

    code = 503
    reason = "ServiceUnavailable"


class ValidationError(StoreError):
    """An object was rejected whole (422); names the object, the field and the fix.

    ``index`` is set by batch writes (``apply_all``) to the position of the offending object.
    """

    code = 422
    reason = "Invalid"

    def __init__(self, ref: str, field: str | None, problem: str, fix: str | None = None) -> None:
        self.ref = ref
        self.field = field
        self.problem = problem
        self.fix = fix
        self.index: int | None = None
        where = f"{field}: " if field else ""
        message = f"{ref} is invalid: {where}{problem}"
        if fix:
            message += f"; {fix}"
        super().__init__(message)


class UnknownKind(NotFound):
    """A kind name (``pods``, ``netpol``, ``Network``) that the store does not serve."""

    reason = "UnknownKind"
