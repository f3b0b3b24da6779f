"""API tokens: shown once, stored as a hash, scoped, revocable."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
import sqlalchemy as sa
from sqlalchemy import select

from oscar_zoo.registry_db.models import ApiToken, AuditEvent
from oscar_zoo.registry_db.registry import open_registry
from oscar_zoo.registry_db.tokens import (authenticate, check_live, create_token, hash_token,
                                          identify, list_tokens, parse_duration, revoke_token,
                                          state_of)
from oscar_zoo.zoo.errors import Forbidden, InvalidInput, NotFound, Unauthorized


@pytest.fixture
def db(registry_db_url, tmp_path):
    registry = open_registry(registry_db_url, tmp_path / "data")
    yield registry.db
    registry.close()


def test_token_lifecycle(db):
    with db.write() as s:
        row, token = create_token(s, ["bundles:publish"], "ci")
    assert token.startswith("ozk_") and len(token) == 47
    with db.read() as s:
        stored = s.scalar(select(ApiToken))
        assert stored.token_hash == hash_token(token) and token not in repr(stored.__dict__)
        assert authenticate(s, token, "bundles:publish").name == "ci"
        with pytest.raises(Forbidden, match="jobs:submit"):
            authenticate(s, token, "jobs:submit")
        with pytest.raises(Unauthorized):
            authenticate(s, None, "bundles:publish")
        with pytest.raises(Unauthorized):
            authenticate(s, token[:-1] + ("A" if token[-1] != "A" else "B"), "bundles:publish")
        audit = list(s.scalars(select(AuditEvent)))
        assert [a.action for a in audit] == ["token.create"]
        assert token not in str(audit[0].detail)
    with db.write() as s:
        revoke_token(s, "ci")
    with db.read() as s:
        with pytest.raises(Unauthorized, match="revoked"):
            authenticate(s, token, "bundles:publish")
        assert list_tokens(s)[0].revoked_at is not None


def test_admin_implies_every_scope_and_bad_scopes(db):
    with db.write() as s:
        _, token = create_token(s, ["admin"])
        for scope in ("bundles:publish", "jobs:submit", "admin"):
            authenticate(s, token, scope)
        with pytest.raises(InvalidInput, match="unknown scope"):
            create_token(s, ["root"])
        with pytest.raises(NotFound):
            revoke_token(s, "nobody")


@pytest.mark.parametrize("name, error", [("x" * 195, "at most 194 characters"),
                                         ("ci\x00bot", "printable text, without NUL")],
                         ids=["long", "nul"])
def test_a_token_name_must_fit_in_the_actor_it_becomes(db, name, error):
    """Every write records `token:<name>` in a String(200) column: with a 195..200-character
    name the token was created, then each of its writes failed on PostgreSQL (a 500)."""
    from oscar_zoo.registry_db.tokens import NAME_MAX, actor_of

    assert NAME_MAX == 194
    with db.write() as s:
        with pytest.raises(InvalidInput, match=error):
            create_token(s, ["bundles:publish"], name)
        row, _ = create_token(s, ["bundles:publish"], "x" * NAME_MAX)
        assert actor_of(row) == "token:" + "x" * NAME_MAX and len(actor_of(row)) == 200
    with db.read() as s:
        assert [t.name for t in list_tokens(s)] == ["x" * NAME_MAX]


def test_revoking_by_id_wins_over_a_name_that_reads_the_same(db):
    """A token named "1" made token 1 unrevocable by its id: "2 tokens match '1'; revoke by id"."""
    with db.write() as s:
        first, _ = create_token(s, ["bundles:publish"], "ci")
        named, _ = create_token(s, ["bundles:publish"], str(first.id))
        first_id, named_id = first.id, named.id
    with db.write() as s:
        assert revoke_token(s, str(first_id)).id == first_id
    with db.write() as s:   # now the name is the only live match
        assert revoke_token(s, str(first_id)).id == named_id
    with db.read() as s:
        assert all(t.revoked_at is not None for t in list_tokens(s))


def test_a_token_is_revoked_by_itself_and_never_echoed(db):
    """A leaked token is what its owner holds: `tokens revoke ozk_...` said "no live token with
    id, name or prefix 'ozk_<the whole secret>'" (on stderr, into CI logs) and revoked nothing."""
    with db.write() as s:
        row, token = create_token(s, ["admin"], "ci")
        _, other = create_token(s, ["admin"], "other")
        row_id = row.id
    with db.write() as s:
        assert revoke_token(s, token, by="cli").id == row_id
    with db.read() as s:
        with pytest.raises(Unauthorized, match="revoked"):
            authenticate(s, token, "admin")
        authenticate(s, other, "admin")
    with db.write() as s:
        with pytest.raises(NotFound) as gone:
            revoke_token(s, token)       # already revoked
    assert token not in str(gone.value) and token[4:12] not in str(gone.value)


def test_an_unnamed_token_is_named_by_its_id(db):
    """The default name was `token-` + characters 4..10 of the secret, and the name is shown in
    `tokens list`, the audit log and (as `token:<name>`) every version's public created_by."""
    from oscar_zoo.registry_db.tokens import actor_of

    with db.write() as s:
        row, token = create_token(s, ["bundles:publish"])
        assert row.name == f"token-{row.id}" and actor_of(row) == f"token:token-{row.id}"
        audit = s.scalar(select(AuditEvent))
        assert audit.detail["name"] == row.name
    with db.read() as s:
        assert list_tokens(s)[0].name == f"token-{row.id}"
    secret = token[4:]
    assert not any(secret[i:i + 6] in row.name for i in range(len(secret) - 5))


def test_a_live_tokens_name_is_its_own(db):
    """Two live tokens named `ci` wrote the same actor into the audit log and every created_by,
    and `tokens revoke ci` refused to choose. A revoked token's name is free again."""
    from sqlalchemy.exc import IntegrityError

    with db.write() as s:
        first, _ = create_token(s, ["admin"], "ci")
        first_id = first.id
    with db.write() as s:
        with pytest.raises(InvalidInput, match=rf"already named 'ci' \(id {first_id}\).*"
                                               rf"oscar-zoo tokens revoke {first_id}"):
            create_token(s, ["admin"], "ci")
        with pytest.raises(InvalidInput, match="the form of an unnamed token's name"):
            create_token(s, ["admin"], "token-99")
        a, _ = create_token(s, ["admin"])      # two unnamed ones in one transaction
        b, _ = create_token(s, ["admin"])
        assert (a.name, b.name) == (f"token-{a.id}", f"token-{b.id}")
    with db.write() as s:
        revoke_token(s, "ci")
    with db.write() as s:
        again, _ = create_token(s, ["admin"], "ci")
        assert again.id != first_id
    with pytest.raises(IntegrityError):        # the database holds the rule, not only the check
        with db.write() as s:
            s.add(ApiToken(name="ci", prefix="ozk_x", token_hash="0" * 64, scopes=["admin"]))
            s.flush()
    with db.read() as s:
        assert sorted(t.name for t in list_tokens(s) if t.revoked_at is None) == sorted(
            ["ci", a.name, b.name])


def _migrated_with(registry_db_url, *tokens: dict):
    """A database at 0008 given these token rows (prefix, scopes, dates filled in), then
    upgraded through 0009 to the head: the Database."""
    from datetime import datetime, timezone

    from oscar_zoo.registry_db import migrate
    from oscar_zoo.registry_db.session import Database

    db = Database(registry_db_url)
    migrate.upgrade(db, "0008")
    base = dict(prefix="ozk_x", scopes=["admin"], revoked_at=None,
                created_at=datetime(2026, 1, 1, tzinfo=timezone.utc))
    with db.write() as s:
        s.execute(ApiToken.__table__.insert(), [{**base, **t} for t in tokens])
    migrate.upgrade(db)
    return db


def test_migration_0009_renames_live_namesakes_and_leaves_revoked_ones(registry_db_url):
    from datetime import datetime, timezone

    db = _migrated_with(
        registry_db_url,
        dict(id=1, name="ci", token_hash="1" * 64),
        dict(id=2, name="ci", token_hash="2" * 64),
        dict(id=3, name="ci", token_hash="3" * 64,
             revoked_at=datetime(2026, 2, 1, tzinfo=timezone.utc)),
        dict(id=4, name="ci-5", token_hash="4" * 64),
        dict(id=5, name="ci", token_hash="5" * 64))
    with db.read() as s:
        assert {t.id: t.name for t in list_tokens(s)} == {1: "ci", 2: "ci-2", 3: "ci", 4: "ci-5",
                                                           5: "ci-5-2"}
        renames = {e.target: (e.actor, e.detail) for e in s.scalars(select(AuditEvent))}
        assert renames == {"token:2": ("migration 0009", {"from": "ci", "to": "ci-2"}),
                           "token:5": ("migration 0009", {"from": "ci", "to": "ci-5-2"})}
    db.dispose()


def test_a_name_taken_at_the_same_moment_is_a_conflict_and_the_transaction_goes_on(db, monkeypatch):
    """The race _check_free cannot see (another writer's insert between its query and ours) is
    the unique index's IntegrityError: a Conflict, and the caller's transaction stays usable."""
    from oscar_zoo.registry_db import tokens as tokens_mod
    from oscar_zoo.zoo.errors import Conflict

    with db.write() as s:
        create_token(s, ["admin"], "ci")
    monkeypatch.setattr(tokens_mod, "_check_free", lambda session, name: None)   # lost the race
    with db.write() as s:
        with pytest.raises(Conflict, match="already named 'ci'"):
            create_token(s, ["admin"], "ci")
        other, _ = create_token(s, ["admin"], "other")     # the same transaction goes on
    with db.read() as s:
        assert sorted(t.name for t in list_tokens(s)) == ["ci", "other"]


def test_migration_0009_frees_the_unnamed_form_for_the_ids_it_names(registry_db_url):
    """A live token named token-<n> before names were checked (n not its id) took the name the
    token with id n gets when it is made unnamed: that insert failed on the unique index."""
    db = _migrated_with(registry_db_url, dict(name="token-2", token_hash="1" * 64))
    with db.write() as s:
        row, _ = create_token(s, ["admin"])
        assert row.id == 2          # the id after the one stored (no explicit ids: PostgreSQL)
    with db.read() as s:
        names = {t.id: t.name for t in list_tokens(s)}
        assert names[2] == "token-2" and names[1] == "token-2-1"
    db.dispose()


def test_migration_0009_renames_an_old_default_name_by_its_id_not_its_secret(registry_db_url):
    """The old default name token-<prefix[4:10]> is a piece of the secret; all digits, it has the
    unnamed form. Renamed, it becomes token-<id> (how it was shown), never <secret piece>-<id>."""
    db = _migrated_with(registry_db_url,
                        dict(name="token-904211", prefix="ozk_904211ab", token_hash="1" * 64))
    with db.read() as s:
        row = list_tokens(s)[0]
        assert row.name == f"token-{row.id}"
        assert all("904211" not in str(e.detail) for e in s.scalars(select(AuditEvent)))
    db.dispose()


@pytest.mark.parametrize("name", ["ci\n   2  ozk_AAAAAAAA...  admin", "\x1b[31mred\x1b[0m",
                                  "\udcff", "ci\u202ebot", "ci\u200b"],
                         ids=["newline", "terminal-escape", "surrogate", "bidi", "zero-width"])
def test_a_token_name_is_printable_text(db, name):
    """The name is printed as is in `tokens list` and, as the actor, in every version's public
    created_by: a newline forged a whole `tokens list` row, an escape recoloured the reader's
    terminal, and a name from an argv byte that is not UTF-8 (an unpaired surrogate) crashed
    `tokens create` with a UnicodeEncodeError traceback instead of saying what is wrong."""
    with db.write() as s:
        with pytest.raises(InvalidInput, match="must be printable text"):
            create_token(s, ["bundles:publish"], name)
        for fine in ("café bot", "作业-runner", "ci ✓"):     # unicode labels stay welcome
            assert create_token(s, ["bundles:publish"], fine)[0].name == fine
    with db.read() as s:
        assert sorted(t.name for t in list_tokens(s)) == sorted(["café bot", "作业-runner", "ci ✓"])


def _pieces(secret: str, n: int = 9):
    return [secret[i:i + n] for i in range(len(secret) - n + 1)]


@pytest.mark.parametrize("mangle", [lambda t: "Bearer " + t, lambda t: t[:-1], lambda t: t + "x",
                                    lambda t: f"'{t}'"],
                         ids=["bearer", "cut-short", "one-more", "quoted"])
def test_a_mangled_token_given_to_revoke_is_not_echoed(db, mangle):
    """`tokens revoke` repeated what it was given when that was not exactly a token: a leaked
    token pasted with `Bearer `, a quote, or a character lost or added went whole (or all but
    one character) into the error on stderr, and into the CI log holding it."""
    with db.write() as s:
        _, token = create_token(s, ["admin"], "ci")
    with db.write() as s:
        with pytest.raises(NotFound, match="give the token alone") as gone:
            revoke_token(s, mangle(token))
    message = str(gone.value)
    assert not any(piece in message for piece in _pieces(token[4:])), message
    with db.read() as s:
        authenticate(s, token, "admin")            # nothing was revoked


def test_a_token_read_with_its_newline_is_revoked(db):
    """A leaked token read from a file or a secret store keeps its newline; it is the token
    still: it was refused (and echoed whole) as an unknown name."""
    with db.write() as s:
        row, token = create_token(s, ["admin"], "ci")
        row_id = row.id
    with db.write() as s:
        assert revoke_token(s, f" {token}\n").id == row_id
    with db.read() as s:
        with pytest.raises(Unauthorized, match="revoked"):
            authenticate(s, token, "admin")


# --- expiry ------------------------------------------------------------------------------------

def _expire(db, token_id: int, ago: timedelta = timedelta(minutes=5)) -> datetime:
    """Move the token's expiry into the past (what waiting would do): the time it expired."""
    at = datetime.now(timezone.utc) - ago
    with db.write() as s:
        s.get(ApiToken, token_id).expires_at = at
    return at


@pytest.mark.parametrize("text, expected", [
    ("30m", timedelta(minutes=30)), ("12h", timedelta(hours=12)), ("90d", timedelta(days=90)),
    ("52w", timedelta(weeks=52)), (" 7d\n", timedelta(days=7))])
def test_an_expiry_is_a_number_and_a_unit(text, expected):
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text, error", [
    ("90", "not a duration"), ("1y", "not a duration"), ("-5d", "not a duration"),
    ("1.5h", "not a duration"), ("", "not a duration"), ("90 d", "not a duration"),
    ("0d", "more than 0"), ("3651d", "at most 3650d"), ("999999999999w", "at most 3650d")])
def test_a_bad_expiry_names_the_forms_it_takes(text, error):
    with pytest.raises(InvalidInput, match=error) as refused:
        parse_duration(text)
    message = str(refused.value)
    assert "30m, 12h, 90d, 52w" in message or "leave it out" in message, message


def test_an_expired_token_is_refused_and_its_holder_told_when(db):
    """Tokens never expired: one leaked from an old CI log was good forever unless someone
    remembered to revoke it."""
    with db.write() as s:
        row, token = create_token(s, ["jobs:work"], "nightly-bot", expires_in=timedelta(hours=1))
        _, forever = create_token(s, ["admin"], "forever")
        row_id = row.id
        left = row.expires_at - datetime.now(timezone.utc)
        assert timedelta(minutes=59) < left <= timedelta(hours=1)
        created = s.scalar(select(AuditEvent).where(AuditEvent.target == f"token:{row_id}"))
        assert created.detail["expires_at"] == row.expires_at.isoformat(timespec="seconds")
    with db.read() as s:
        assert authenticate(s, token, "jobs:work").id == row_id  # not yet
        assert state_of(s.get(ApiToken, row_id)) == "live"
    at = _expire(db, row_id)
    with db.read() as s:
        for check in (lambda: authenticate(s, token, "jobs:work"), lambda: identify(s, token),
                      lambda: check_live(s, row_id)):
            with pytest.raises(Unauthorized, match="expired at") as refused:
                check()
            message = str(refused.value)
            assert at.isoformat(timespec="seconds") in message and "tokens create" in message
            # nothing else of the token: not its name, id or scopes
            assert "nightly-bot" not in message and "jobs:work" not in message, message
            assert f"token:{row_id}" not in message and f"id {row_id}" not in message
        authenticate(s, forever, "admin")                        # no expiry: good until revoked
        assert {t.name: state_of(t) for t in list_tokens(s)} == {"nightly-bot": "expired",
                                                              "forever": "live"}


def test_an_expired_token_revoked_is_only_unknown_or_revoked(db):
    """Revoked wins: the holder of a revoked token learns no more than today (not that it had
    also expired), as the holder of an unknown one learns nothing."""
    with db.write() as s:
        row, token = create_token(s, ["admin"], "ci", expires_in=timedelta(days=1))
        row_id = row.id
    _expire(db, row_id)
    with db.write() as s:
        revoke_token(s, str(row_id))
    with db.read() as s:
        for check in (lambda: authenticate(s, token, "admin"), lambda: check_live(s, row_id)):
            with pytest.raises(Unauthorized, match="revoked") as refused:
                check()
            assert "expired" not in str(refused.value)
        assert state_of(list_tokens(s)[0]) == "revoked"


def test_an_expired_token_keeps_its_name_until_revoked(db):
    """The name is the actor of the token's writes (one live token per name, the index counts
    every token not revoked): reusing it takes a revoke, and the refusal says so."""
    with db.write() as s:
        row, _ = create_token(s, ["admin"], "ci", expires_in=timedelta(days=1))
        row_id = row.id
    _expire(db, row_id)
    with db.write() as s:
        with pytest.raises(InvalidInput, match=rf"named 'ci' \(id {row_id}\) expired at .* keeps "
                                               rf"its name until it is revoked.*oscar-zoo tokens "
                                               rf"revoke {row_id}"):
            create_token(s, ["admin"], "ci")
    with db.write() as s:
        assert revoke_token(s, "ci").id == row_id                # an expired token is revocable
    with db.write() as s:
        assert create_token(s, ["admin"], "ci")[0].expires_at is None


def test_migration_0010_downgrade_revokes_the_expired_tokens(registry_db_url):
    """The schema before 0010 has no expiry: an expired token would be good again there."""
    from alembic import command

    from oscar_zoo.registry_db import migrate
    from oscar_zoo.registry_db.session import Database

    db = Database(registry_db_url)
    migrate.upgrade(db)
    with db.write() as s:
        old, _ = create_token(s, ["admin"], "old", expires_in=timedelta(days=1))
        fresh, _ = create_token(s, ["admin"], "fresh", expires_in=timedelta(days=1))
        ids = (old.id, fresh.id)
    _expire(db, ids[0])
    cfg = migrate._config()
    with db.engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0009")
    with db.engine.connect() as conn:
        rows = dict(conn.execute(sa.text("select id, revoked_at from api_tokens")).all())
        events = conn.execute(sa.text("select actor, action, target from audit_log "
                                      "where action = 'token.revoke'")).all()
    assert rows[ids[0]] is not None and rows[ids[1]] is None
    assert events == [("migration 0010 downgrade", "token.revoke", f"token:{ids[0]}")]
    db.dispose()
