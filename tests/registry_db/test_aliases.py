"""Moving aliases while versions change status (PostgreSQL: two transactions really overlap;
SQLite has one writer, so they cannot)."""

from __future__ import annotations

import pytest
from sqlalchemy import select
from sqlalchemy.exc import OperationalError

from oscar_zoo.registry_db.aliases import move_alias
from oscar_zoo.registry_db.models import BundleVersion
from oscar_zoo.registry_db.publish import yank_version
from oscar_zoo.registry_db.queries import alias_map, resolve_model, resolve_version
from oscar_zoo.registry_db.registry import open_registry
from oscar_zoo.zoo.errors import Conflict
from tests.utils.bundles import make_bundle

MODEL = "smollm2-135m"


@pytest.fixture
def registry(registry_db_url, tmp_path):
    reg = open_registry(registry_db_url, tmp_path / "data")
    if reg.db.is_sqlite:
        reg.close()
        pytest.skip("SQLite has one writer: the two transactions cannot overlap")
    make_bundle(tmp_path / "b")
    reg.publish(tmp_path / "b", "token:pub")
    yield reg
    reg.close()


def _yank(registry, reason: str = "broken") -> None:
    with registry.db.write() as s:
        yank_version(s, resolve_version(s, resolve_model(s, MODEL), 1), reason, "token:ops")


def test_an_alias_is_not_moved_to_a_version_yanked_since_it_was_read(registry):
    """PUT .../aliases/recommended read the version as published; a yank committed before the
    move: the alias pointed at the yanked version."""
    with registry.db.write() as s:
        model = resolve_model(s, MODEL)
        version = resolve_version(s, model, "1")
        assert version.status == "published"
        _yank(registry)
        with pytest.raises(Conflict, match="version 1 is yanked"):
            move_alias(s, model, "recommended", version, "token:pub")
    with registry.db.read() as s:
        assert "recommended" not in alias_map(s, resolve_model(s, MODEL))


def test_a_yank_waits_for_an_alias_move_in_flight(registry):
    """A yank that committed between the move's status check and its commit left the alias on
    a yanked version just the same: the move holds the version's status until it commits."""
    with registry.db.write() as s:
        model = resolve_model(s, MODEL)
        move_alias(s, model, "recommended", resolve_version(s, model, "1"), "token:pub")
        with pytest.raises(OperationalError, match="lock"), registry.db.write() as other:
            # the yank's own lock (yank_version), without waiting: it must not be granted now
            other.execute(select(BundleVersion.id).where(BundleVersion.number == 1)
                          .with_for_update(key_share=True, nowait=True))
    _yank(registry)     # after the move's commit: the yank goes ahead
    with registry.db.read() as s:
        assert resolve_version(s, resolve_model(s, MODEL), "1").status == "yanked"


def test_two_moves_creating_the_same_alias_both_land(registry, tmp_path):
    """FOR UPDATE locks no row before the alias exists: the second of two first moves hit the
    unique index and answered 500. It now waits for the first, then moves the row it made."""
    import threading
    import time

    make_bundle(tmp_path / "b2", seed=2)
    registry.publish(tmp_path / "b2", "token:pub")
    errors: list[BaseException] = []

    def second():
        try:
            with registry.db.write() as s:
                model = resolve_model(s, MODEL)
                move_alias(s, model, "recommended", resolve_version(s, model, "2"), "token:b")
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    with registry.db.write() as s:
        model = resolve_model(s, MODEL)
        move_alias(s, model, "recommended", resolve_version(s, model, "1"), "token:a")
        t = threading.Thread(target=second)
        t.start()
        time.sleep(0.5)     # the second move is now waiting on this one's uncommitted row
    t.join(30)
    assert not errors, errors
    with registry.db.read() as s:
        model = resolve_model(s, MODEL)
        assert alias_map(s, model)["recommended"] == 2


@pytest.mark.parametrize("name", ["prod\n", "prod\r", "recommended\n"])
def test_an_alias_name_ending_in_a_newline_is_refused(name):
    """`$` matches before a final newline: `prod\\n` was created, and no ref could resolve it."""
    from oscar_zoo.registry_db.aliases import check_alias_name
    from oscar_zoo.zoo.errors import InvalidInput

    with pytest.raises(InvalidInput, match="is not valid"):
        check_alias_name(name)
    assert check_alias_name(name.strip()) == name.strip()


def _in_thread(fn) -> tuple:
    import threading

    errors: list[BaseException] = []

    def run():
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - reported by the caller
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    return t, errors


def test_a_yank_keeps_an_alias_a_concurrent_move_pointed_elsewhere(registry, tmp_path):
    """The yank of v1 read `recommended -> 1` before a move to v2 committed, waited for the
    row, then deleted it anyway: the alias was gone though v2 is published."""
    import time

    make_bundle(tmp_path / "b2", seed=2)
    registry.publish(tmp_path / "b2", "token:pub")
    with registry.db.write() as s:
        model = resolve_model(s, MODEL)
        move_alias(s, model, "recommended", resolve_version(s, model, "1"), "token:a")
    with registry.db.write() as s:
        model = resolve_model(s, MODEL)
        move_alias(s, model, "recommended", resolve_version(s, model, "2"), "token:a", "v2 is better")
        t, errors = _in_thread(lambda: _yank(registry, "bad clip"))
        time.sleep(0.5)     # the yank is now waiting on this move
    t.join(30)
    assert not errors, errors
    with registry.db.read() as s:
        assert alias_map(s, resolve_model(s, MODEL))["recommended"] == 2


def test_an_alias_move_beside_a_publish_moving_aliases_does_not_deadlock(registry, tmp_path):
    """A job's result holds the model row (to number its version) and then moves the spec's
    aliases; a PUT of the same alias took the alias row first and then waited on the model row
    for its history event: PostgreSQL aborted one of the two (DeadlockDetected, a 500)."""
    import time

    from oscar_zoo.registry_db.models import Model

    make_bundle(tmp_path / "b2", seed=2)
    registry.publish(tmp_path / "b2", "token:pub")

    def user_moves():
        with registry.db.write() as s:
            model = resolve_model(s, MODEL)
            move_alias(s, model, "recommended", resolve_version(s, model, "1"), "token:user")

    with registry.db.write() as s:
        model = resolve_model(s, MODEL)
        s.execute(select(Model.id).where(Model.id == model.id).with_for_update())  # as publishing
        t, errors = _in_thread(user_moves)
        time.sleep(0.5)
        move_alias(s, model, "recommended", resolve_version(s, model, "2"), "token:job")
    t.join(30)
    assert not errors, errors
    with registry.db.read() as s:
        assert alias_map(s, resolve_model(s, MODEL))["recommended"] == 1   # the user's, after
