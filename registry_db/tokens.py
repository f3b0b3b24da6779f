"""API tokens: `ozk_` + 43 url-safe characters (256 random bits), stored as sha256 only.

A plain (unkeyed, unsalted) sha256 is enough here: the tokens are random and long, so unlike
passwords there is nothing to brute-force, and a lookup by hash stays one indexed query. The
`ozk_` prefix makes a leaked token greppable (secret scanners match on it).

A token may expire (`expires_at`, migration 0010): past it the token is refused like a revoked
one, except that its holder is told it expired. It keeps its name until revoked, so the same
name needs a revoke first (the live-name index counts every token not revoked).
"""

from __future__ import annotations

import hashlib
import re
import secrets
from datetime import datetime, timedelta, timezone

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from ..zoo.errors import Conflict, Forbidden, InvalidInput, NotFound, Unauthorized
from ..zoo.registry_client import MALFORMED_TOKEN, TOKEN_SHAPE as _SHAPE
from . import audit
from .models import SCOPES, ApiToken

PREFIX = "ozk_"
_AUTO_NAME = re.compile(r"token-\d+")
# more of a token than the prefix `tokens list` shows (ozk_ + 8): a secret, never repeated
_SECRET_RUN = re.compile(r"ozk_[A-Za-z0-9_-]{9,}")
ACTOR = "token:"
ACTOR_MAX = 200                          # created_by, updated_by and the audit log's actor
NAME_MAX = ACTOR_MAX - len(ACTOR)        # so that token:<name> fits
_DURATION = re.compile(r"([0-9]{1,12})([mhdw])")
_UNITS = {"m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
# far enough for any rotation policy, near enough that now + it is a datetime
EXPIRY_MAX = timedelta(days=3650)
DURATION_FORMS = ("a whole number and a unit: m (minutes), h (hours), d (days) or w (weeks), "
                  "e.g. 30m, 12h, 90d, 52w")


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def parse_duration(text: str) -> timedelta:
    """`30m`, `12h`, `90d`, `52w`: how long a new token lives. Raises InvalidInput."""
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise InvalidInput(f"expiry {text!r} is not a duration: give {DURATION_FORMS}")
    number, unit = match.groups()
    try:
        duration = timedelta(**{_UNITS[unit]: int(number)})
    except OverflowError:           # past timedelta's range: too long, like any past the cap
        duration = timedelta.max
    if not timedelta(0) < duration <= EXPIRY_MAX:
        raise InvalidInput(f"expiry {text!r}: give more than 0 and at most {EXPIRY_MAX.days}d; "
                           "leave it out for a token that does not expire")
    return duration


def create_token(session: Session, scopes: list[str], name: str = "",
                 created_by: str | None = None,
                 expires_in: timedelta | None = None) -> tuple[ApiToken, str]:
    """A new token row and the token itself, which is not stored and cannot be shown again.
    expires_in: how long it is good for (None: until revoked).

    Raises InvalidInput for an unknown scope.
    """
    bad = [s for s in scopes if s not in SCOPES]
    if bad or not scopes:
        raise InvalidInput(f"unknown scope(s) {bad or '(none)'}; choose from {', '.join(SCOPES)}")
    _check_name(name)
    _check_free(session, name)
    token = PREFIX + secrets.token_urlsafe(32)
    # an unnamed token is token-<id>, known after the insert; until then a name no one can pick
    # (names are unique among live tokens, and two unnamed ones may be made at once)
    expires_at = datetime.now(timezone.utc) + expires_in if expires_in is not None else None
    row = ApiToken(name=name or f"\x01{secrets.token_hex(16)}", prefix=token[:12],
                   token_hash=hash_token(token), scopes=sorted(set(scopes)), created_by=created_by,
                   expires_at=expires_at)
    try:
        # a savepoint: the caller's transaction stays usable when the name is taken
        with session.begin_nested():
            session.add(row)
            session.flush()
            # not from the token's characters: the name is the public actor of its writes
            row.name = name or f"token-{row.id}"
            session.flush()
    except IntegrityError:              # the same name, made at the same moment
        raise Conflict(f"a live token is already named {name or 'token-<its id>'!r}; choose "
                       "another name") from None
    audit.record(session, created_by, "token.create", f"token:{row.id}", name=row.name,
                 scopes=row.scopes, expires_at=_iso(expires_at))
    return row, token


def _check_free(session: Session, name: str) -> None:
    """InvalidInput unless `name` is free among live tokens (or empty: then token-<id>)."""
    if not name:
        return
    if _AUTO_NAME.fullmatch(name):
        raise InvalidInput(f"{name!r} is the form of an unnamed token's name (token-<id>); choose "
                           "another name, or give none to get one")
    same = session.scalar(select(ApiToken).where(ApiToken.name == name,
                                                 ApiToken.revoked_at.is_(None)))
    if same is not None and is_expired(same):
        raise InvalidInput(f"a token named {name!r} (id {same.id}) expired at "
                           f"{_iso(same.expires_at)} and keeps its name until it is revoked; "
                           f"revoke it first: oscar-zoo tokens revoke {same.id}, or choose "
                           "another name")
    if same is not None:
        raise InvalidInput(f"a live token is already named {name!r} (id {same.id}); choose another "
                           f"name, or revoke it first: oscar-zoo tokens revoke {same.id}")


def _check_name(name: str) -> None:
    # the name is recorded as the actor of every write the token makes: too long, or with a NUL
    # (PostgreSQL text cannot hold one), each of those writes would fail
    if len(name) > NAME_MAX:
        raise InvalidInput(f"a token name must be at most {NAME_MAX} characters "
                           f"(got {len(name)} characters); choose a shorter label")
    # it is also printed as is (`tokens list`, every version's public created_by, the audit
    # log): a newline or a terminal escape there forges lines or recolours a reader's terminal,
    # and an unpaired surrogate (an argv byte that is not UTF-8) cannot be stored at all
    if not name.isprintable():
        raise InvalidInput("a token name must be printable text, without NUL, newlines, "
                           "terminal escapes or other control or invisible characters; choose "
                           "another label")


def is_expired(row: ApiToken, now: datetime | None = None) -> bool:
    return row.expires_at is not None and row.expires_at <= (now or datetime.now(timezone.utc))


def state_of(row: ApiToken, now: datetime | None = None) -> str:
    """live, expired or revoked (a revoked token is that, whether or not it also expired)."""
    if row.revoked_at is not None:
        return "revoked"
    return "expired" if is_expired(row, now) else "live"


def _iso(at: datetime | None) -> str | None:
    return at.isoformat(timespec="seconds") if at is not None else None


def actor_of(row: ApiToken) -> str:
    """`token:<name>`: who a write was made by, in created_by and the audit log."""
    # cut, for a name longer than NAME_MAX made before names were checked
    return f"{ACTOR}{_public_name(row)}"[:ACTOR_MAX]


def _public_name(row: ApiToken) -> str:
    """The token's name, except the default name once made from the token's own characters 4..10
    (`token-` + prefix[4:10]), which was a piece of the secret: that one is shown by id."""
    if row.prefix and row.name == f"token-{row.prefix[len(PREFIX):len(PREFIX) + 6]}":
        return f"token-{row.id}"
    return row.name


def authenticate(session: Session, token: str | None, scope: str) -> ApiToken:
    """The live token row allowed to use `scope` (admin may use any).

    Raises Unauthorized (no, malformed, unknown, revoked or expired token), Forbidden (wrong
    scope).
    """
    row = identify(session, token)
    if scope not in row.scopes and "admin" not in row.scopes:
        raise missing_scope(row, scope)
    return row


def missing_scope(row: ApiToken, scope: str) -> Forbidden:
    """The refusal of a live token that lacks `scope`. Its problem body carries `required_scope`
    and `token_scopes`, so that a client can tell its user what to ask for without parsing the
    detail; the detail is for whoever calls the API by hand. Names the token as its writes do
    (actor_of: a legacy default name holds characters of the secret), never the token."""
    err = Forbidden(f"token {actor_of(row)} has scopes {list(row.scopes)}; this needs {scope!r}: "
                    f"ask the registry's operator for a token with it (on the registry's host: "
                    f"`oscar-zoo tokens create --scope {scope} ...`)")
    err.extensions = {"required_scope": scope, "token_scopes": list(row.scopes)}
    return err


def identify(session: Session, token: str | None) -> ApiToken:
    """The live token row, whatever its scopes. Raises Unauthorized."""
    if not token:
        raise Unauthorized("this endpoint needs a token: send 'Authorization: Bearer ozk_...' "
                           "(create one with `oscar-zoo tokens create --scope ...`)")
    if not _SHAPE.fullmatch(token):
        raise Unauthorized(MALFORMED_TOKEN)
    row = session.scalar(select(ApiToken).where(ApiToken.token_hash == hash_token(token)))
    if row is None or row.revoked_at is not None:
        raise Unauthorized("unknown or revoked token; create a new one with `oscar-zoo tokens create`")
    # only the token's own holder gets this far (the lookup was by its hash): it may learn
    # when its token ran out, and nothing else of it (no name, no scopes)
    if is_expired(row):
        raise Unauthorized(f"this token expired at {_iso(row.expires_at)}; create a new one "
                           "with `oscar-zoo tokens create --scope ... --expires-in 90d` (or ask "
                           "the registry's admin for one)")
    return row


def check_live(session: Session, token_id: int) -> None:
    """The token a request was authenticated with is still live at its write. A request that
    waits long after its check (a claim's long poll, a large upload) must not write once its
    token is revoked or has expired. PostgreSQL: the row is share-locked, so a revoke waits for
    this write's commit or comes first (SQLite writers are serialized anyway). Raises
    Unauthorized."""
    row = session.scalar(select(ApiToken).where(ApiToken.id == token_id).with_for_update(read=True))
    if row is None or row.revoked_at is not None:
        raise Unauthorized("the token was revoked while this request was in progress, and nothing "
                           "was written; create a new one with `oscar-zoo tokens create`")
    if is_expired(row):
        raise Unauthorized(f"the token expired at {_iso(row.expires_at)}, while this request was "
                           "in progress, and nothing was written; create a new one with "
                           "`oscar-zoo tokens create --scope ... --expires-in 90d`")


def list_tokens(session: Session) -> list[ApiToken]:
    return list(session.scalars(select(ApiToken).order_by(ApiToken.id)))


def revoke_token(session: Session, ident: str, by: str | None = None) -> ApiToken:
    """Revoke by id, name, prefix or the token itself. Raises NotFound, or InvalidInput when a
    name is ambiguous. A token given is never repeated in an error."""
    live = [t for t in list_tokens(session) if t.revoked_at is None]
    token = ident.strip()           # read from a file or a secret store: a newline may follow
    if _SHAPE.fullmatch(token):     # a leaked token, as its holder has it
        rows = [t for t in live if t.token_hash == hash_token(token)]
        shown = "(the token given)"
    else:
        # an id names one token: it wins over a token whose name or prefix happens to read the same
        rows = [t for t in live if str(t.id) == ident] or [t for t in live if ident in (t.name, t.prefix)]
        # a token mangled on its way here (cut short, pasted with `Bearer ` or a quote) is still
        # a secret, or nearly all of one: stderr goes into CI logs
        shown = ("(a value holding a token's characters, not repeated: give the token alone, "
                 "ozk_ and 43 characters)" if _SECRET_RUN.search(ident) else repr(ident))
    if not rows:
        raise NotFound(f"no live token with id, name, prefix or token {shown}; "
                       "see `oscar-zoo tokens list`")
    if len(rows) > 1:
        raise InvalidInput(f"{len(rows)} tokens match {shown}; revoke by id")
    rows[0].revoked_at = datetime.now(timezone.utc)
    audit.record(session, by, "token.revoke", f"token:{rows[0].id}", name=_public_name(rows[0]))
    return rows[0]
