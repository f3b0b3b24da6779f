"""Domain exceptions for all of oscar-zoo.

Each subclasses the builtin it refines, so callers can catch `LookupError` or `OSError` without
knowing us. Every message says what went wrong *and how to fix it*. The API maps these to HTTP
status codes in one place (api/errors.py, via `http_status`); the CLI turns them into one line
on stderr and a non-zero exit (zoo/cli/main.py).
"""

from __future__ import annotations

import errno as _errno


class OscarZooError(Exception):
    """Base of every domain error. `http_status` is used by the API's single handler."""

    http_status = 500
    title = "Internal error"


# --- bad input -------------------------------------------------------------------------------

class InvalidInput(OscarZooError, ValueError):
    http_status = 422
    title = "Invalid input"


class BundleFormatError(InvalidInput):
    """A bundle directory, manifest or tensor file is malformed or inconsistent."""

    title = "Invalid bundle"


class UnsafePickleError(InvalidInput):
    """A .pt file tried to unpickle something other than plain tensors and containers."""

    title = "Refused unsafe pickle"


class UnsafePathError(InvalidInput):
    """A user-supplied file name would escape its directory."""

    http_status = 400
    title = "Unsafe path"


class UnsupportedModelError(InvalidInput):
    """The model's attention kind (MLA, linear attention, ...) has no OSCAR KV rotations."""

    title = "Unsupported model"


class ConfigError(InvalidInput):
    """A setting or an environment variable has an invalid value."""

    title = "Invalid configuration"


class SettingError(ConfigError):
    """A setting's value is invalid. The operator's to fix, not the client's: a request that
    meets one is answered 500 (and logged), not 422 as though the request were at fault."""

    http_status = 500


class UnsupportedMediaType(InvalidInput):
    http_status = 415
    title = "Unsupported media type"


class RangeNotSatisfiable(InvalidInput):
    http_status = 416
    title = "Range not satisfiable"


class PayloadTooLarge(InvalidInput):
    http_status = 413
    title = "Payload too large"


# --- not found -------------------------------------------------------------------------------

class NotFound(OscarZooError, LookupError):
    http_status = 404
    title = "Not found"

    def __init__(self, message: str, suggestions: list[str] | None = None):
        self.suggestions = list(suggestions or [])
        if self.suggestions:
            # its own sentence, whether or not the message closed one
            end = "" if message.rstrip().endswith((".", "?", "!")) else "."
            message = f"{message.rstrip()}{end} Did you mean: {', '.join(self.suggestions)}?"
        super().__init__(message)


class ModelNotFound(NotFound):
    title = "Model not found"


class AliasNotFound(NotFound):
    title = "Alias not found"


class LayerNotFound(NotFound):
    title = "Layer not found"


class FileNotInBundle(NotFound):
    title = "File not found"


class VersionNotFound(NotFound):
    title = "Version not found"


class BundleNotFound(NotFound):
    title = "Bundle not found"


class JobNotFound(NotFound):
    title = "Job not found"


# --- integrity, conflicts, state -------------------------------------------------------------

class IntegrityError(OscarZooError, OSError):
    """Bytes on disk or on the wire do not match their recorded sha256 or size."""

    http_status = 422
    title = "Integrity check failed"


class Conflict(OscarZooError, RuntimeError):
    http_status = 409
    title = "Conflict"


class LeaseLost(Conflict):
    """A worker reported on a job it no longer holds (its lease expired and was requeued, or
    the job ended); the worker must stop working on it."""

    title = "Lease lost"


class JobCancelled(OscarZooError, RuntimeError):
    """Raised inside a calibration run when its job was cancelled (checked between steps)."""

    http_status = 409
    title = "Job cancelled"


class YankedVersion(Conflict):
    """The content being published was yanked; it is not published again."""

    title = "Version yanked"


class SchemaOutOfDate(OscarZooError, RuntimeError):
    """The registry database is older than this code; `oscar-zoo db upgrade` migrates it."""

    http_status = 503
    title = "Database schema out of date"


class StorageCorrupt(IntegrityError):
    """A stored blob no longer matches its sha256 (disk corruption or tampering on the server)."""

    http_status = 500
    title = "Stored file failed verification"


class StorageFull(OscarZooError, OSError):
    """A write found its disk, or its owner's quota, full (ENOSPC, EDQUOT). The writers leave
    nothing half-written; the message says where, and how to make room. `path`: the directory,
    for the server's log (the API's answers never show the server's paths)."""

    http_status = 507
    title = "Insufficient storage"

    def __init__(self, message: str, errno: int | None = None, path: str | None = None):
        super().__init__(message)
        self.errno = errno      # ENOSPC or EDQUOT, for callers that test OSError's errno
        self.path = path

    def __reduce__(self):
        # OSError's own reduce rebuilds from args (the message alone) and loses errno, which
        # lives outside __dict__: a StorageFull raised in a Ray task or a child process came
        # back without it
        message = self.args[0] if self.args else ""
        return type(self), (message, self.errno, self.path), dict(self.__dict__)


class LockTimeout(OscarZooError, TimeoutError):
    http_status = 503
    title = "Lock timeout"


# --- network and auth ------------------------------------------------------------------------

class OfflineError(OscarZooError, ConnectionError):
    """Offline mode is on (or the network is unreachable) and the cache cannot answer."""

    http_status = 503
    title = "Offline"


class DatabaseUnavailable(OscarZooError, ConnectionError):
    """The registry database cannot be connected to: no such database, nothing listening, a
    refused login (registry_db/session.py, connect_failure)."""

    http_status = 503
    title = "Database unavailable"


class RemoteError(OscarZooError, ConnectionError):
    """A registry or hub answered with an error we cannot recover from."""

    http_status = 502
    title = "Remote error"


class RemoteStorageFull(StorageFull, RemoteError):
    """A registry answered 507: its disk, quota or database is full. Its message is the
    registry's (what it was writing, and that its operator must make room). A RemoteError too,
    so what waits out a registry's errors while holding a lease (a worker's heartbeats, claims,
    small reports) still does; but not transient: the same request is refused until someone
    makes room, so nothing re-sends it on its own (is_transient, RegistryClient.request).
    errno stays None: the registry's disk is not this machine's."""

    status = 507


# HTTP answers that say "not now" (too slow, too early, too many requests) and nothing of the
# request itself: retried like a 5xx, and pull may stand a cached copy in for them
TRY_LATER = frozenset({408, 425, 429})


def is_transient(e: Exception) -> bool:
    """Worth another try: connection errors, TRY_LATER and 5xx answers, and remote errors of no
    known status (a damaged read); a 400 or 422 will only be refused again, with seconds of
    backoff between, and so is a 507 (a full disk stays full until someone makes room)."""
    if isinstance(e, OfflineError):
        return "offline mode" not in str(e)
    if not isinstance(e, RemoteError) or isinstance(e, StorageFull):
        return False
    status = getattr(e, "status", None)
    return status is None or status in TRY_LATER or status >= 500


NO_SPACE = frozenset({_errno.ENOSPC, _errno.EDQUOT})


def is_no_space(e: BaseException) -> bool:
    """A full disk or quota (ENOSPC, EDQUOT) not yet told as StorageFull."""
    return isinstance(e, OSError) and not isinstance(e, StorageFull) and e.errno in NO_SPACE


class Unauthorized(OscarZooError, PermissionError):
    http_status = 401
    title = "Unauthorized"


class Forbidden(OscarZooError, PermissionError):
    http_status = 403
    title = "Forbidden"


def public_line(text: str, cap: int = 500) -> str:
    """A job's error as anyone may read it: the first line, capped. Exception texts go on over
    lines (CUDA's, a remote traceback) and name the worker host's paths; its log keeps them
    whole. Workers store by this rule and the API reads older rows by it."""
    line = (text or "").strip().split("\n", 1)[0].strip()
    return line if len(line) <= cap else line[:cap - 3] + "..."
