"""One actionable line, not a traceback, for settings the CLI cannot use: a registry database
that cannot be connected to (zoo/cli/main.py, registry_db/session.py), an endpoint without its
scheme (zoo/registry_client.py); and the OSCAR_ZOO_OFFLINE hint only where the cache can help."""

from __future__ import annotations

import uuid
from urllib.parse import urlsplit

import pytest
from click.testing import CliRunner

from oscar_zoo.zoo.cli.main import cli
from tests.utils.databases import POSTGRES_URL, postgres_unavailable

URL_FIX = ("check OSCAR_ZOO_DATABASE_URL (SQLite: sqlite:///path; PostgreSQL: "
           "postgresql://user@host:port/db)")


def _told(args: list[str]):
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1, result.output + result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    return lines[0]


@pytest.fixture
def missing_database(monkeypatch) -> str:
    """A PostgreSQL URL, with a password, of a database that does not exist on a live server."""
    if (why := postgres_unavailable()) is not None:
        pytest.skip(why)
    parts = urlsplit(POSTGRES_URL)
    user = parts.username or "postgres"
    url = f"postgresql://{user}:Hunter2pw@{parts.hostname}:{parts.port or 5432}/" \
          f"nodb_{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("OSCAR_ZOO_DATABASE_URL", url)
    return url


@pytest.mark.parametrize("args", [["db", "upgrade"], ["tokens", "list"],
                                  ["tokens", "create", "--scope", "admin"],
                                  ["serve", "--no-workers", "--port", "0"], ["db", "gc"]])
def test_a_database_that_does_not_exist_is_one_line_with_the_password_masked(
        missing_database, args):
    """It was a ~100-line SQLAlchemy traceback."""
    line = _told(args)
    name = missing_database.rsplit("/", 1)[1]
    assert "cannot connect to the database at postgresql+psycopg://" in line
    assert ":***@" in line and "Hunter2pw" not in line
    assert f'database "{name}" does not exist' in line
    assert line.endswith(URL_FIX)


def test_a_refused_port_is_one_line(monkeypatch):
    monkeypatch.setenv("OSCAR_ZOO_DATABASE_URL", "postgresql://postgres:pw@127.0.0.1:1/test")
    line = _told(["db", "upgrade"])
    assert line.startswith("Error: cannot connect to the database at "
                           "postgresql+psycopg://postgres:***@127.0.0.1:1/test: ")
    assert "Connection refused" in line and line.endswith(URL_FIX)


def test_a_missing_driver_says_which_package_to_install(monkeypatch):
    """mysql:// raised ModuleNotFoundError: No module named 'MySQLdb', with its traceback."""
    monkeypatch.setenv("OSCAR_ZOO_DATABASE_URL", "mysql://zoo:S3cret@127.0.0.1/zoo")
    line = _told(["tokens", "list"])
    assert "cannot connect to the database at mysql://zoo:***@127.0.0.1/zoo" in line
    assert "MySQLdb is not installed" in line and "pip install 'mysqlclient'" in line
    assert "S3cret" not in line and line.endswith(URL_FIX)


def test_an_unknown_database_kind_is_one_line(monkeypatch):
    monkeypatch.setenv("OSCAR_ZOO_DATABASE_URL", "nosuchdb://zoo:S3cret@host/zoo")
    line = _told(["db", "upgrade"])
    assert "knows no database kind 'nosuchdb'" in line and "S3cret" not in line


def test_a_sqlite_file_that_cannot_be_opened_is_one_line(tmp_path, monkeypatch):
    where = tmp_path / "registry.sqlite"
    where.mkdir()       # a directory where the database file should be
    monkeypatch.setenv("OSCAR_ZOO_DATABASE_URL", f"sqlite:///{where}")
    line = _told(["db", "upgrade"])
    assert f"cannot connect to the database at sqlite:///{where}: unable to open" in line


def test_a_failed_statement_is_not_told_as_a_connect_failure(tmp_path):
    """Only errors raised while connecting are; a statement's own error keeps its traceback."""
    from sqlalchemy import text
    from sqlalchemy.exc import OperationalError

    from oscar_zoo.registry_db.session import Database, connect_failure

    db = Database(f"sqlite:///{tmp_path / 'r.sqlite'}")
    with pytest.raises(OperationalError) as e, db.read() as s:
        s.execute(text("select * from no_such_table"))
    assert connect_failure(e.value) is None
    db.dispose()


# --- the endpoint ------------------------------------------------------------------------------

@pytest.mark.parametrize("args", [["whoami"], ["list"], ["pull", "qwen3-8b"], ["jobs", "list"]])
def test_an_endpoint_without_a_scheme_says_to_add_http(monkeypatch, args):
    """It was "cannot reach the registry at 127.0.0.1:8000 (UnsupportedProtocol); check ...
    your network"."""
    monkeypatch.setenv("OSCAR_ZOO_ENDPOINT", "127.0.0.1:8000")
    line = _told(args)
    assert line == ("Error: OSCAR_ZOO_ENDPOINT must start with http:// or https://, got "
                    "'127.0.0.1:8000': use http://127.0.0.1:8000")


def test_an_endpoint_without_a_scheme_never_shows_its_password(monkeypatch):
    monkeypatch.setenv("OSCAR_ZOO_ENDPOINT", "alice:S3cret@reg.example:8000")
    line = _told(["whoami"])
    assert "use http://alice:***@reg.example:8000" in line and "S3cret" not in line


@pytest.mark.parametrize("var, value, args", [
    # URLs urlsplit or SQLAlchemy cannot parse: broken IPv6 brackets, a port that is no number
    ("OSCAR_ZOO_ENDPOINT", "http://alice:S3cret@[::1:8000", ["whoami"]),
    ("OSCAR_ZOO_DATABASE_URL", "postgresql://alice:S3cret@db.example:abc/zoo", ["db", "upgrade"]),
])
def test_a_url_that_does_not_parse_never_shows_its_password(monkeypatch, var, value, args):
    monkeypatch.setenv(var, value)
    line = _told(args)
    assert "S3cret" not in line and "alice:***@" in line, line


def test_an_endpoint_of_another_scheme_is_refused(monkeypatch):
    monkeypatch.setenv("OSCAR_ZOO_ENDPOINT", "ftp://reg.example")
    assert "OSCAR_ZOO_ENDPOINT must be an http:// or https:// URL" in _told(["whoami"])


# --- where OSCAR_ZOO_OFFLINE=1 can help ----------------------------------------------------------

DEAD = "http://127.0.0.1:9"     # the discard port: nothing listens there


def _cache_something(cache_root) -> None:
    (cache_root / "models" / "smollm2-135m" / "snapshots" / ("a" * 64)).mkdir(parents=True)


def test_whoami_and_jobs_on_a_dead_registry_do_not_suggest_the_cache(monkeypatch, cache_root):
    _cache_something(cache_root)     # even with something cached: it cannot answer these
    monkeypatch.setenv("OSCAR_ZOO_ENDPOINT", DEAD)
    monkeypatch.setenv("OSCAR_ZOO_HTTP_RETRIES", "0")
    for args in (["whoami"], ["jobs", "list"]):
        line = _told(args)
        assert "cannot reach the registry" in line and "OSCAR_ZOO_OFFLINE" not in line


def test_a_dead_registry_suggests_offline_mode_only_where_the_cache_holds_the_answer(
        monkeypatch, cache_root):
    """It was said wherever the cache held any bundle: `show qwen3-8b` with only smollm2-135m
    cached sent the user to an offline mode that knows nothing more of qwen3-8b."""
    monkeypatch.setenv("OSCAR_ZOO_ENDPOINT", DEAD)
    monkeypatch.setenv("OSCAR_ZOO_HTTP_RETRIES", "0")
    monkeypatch.setenv("OSCAR_ZOO_SOURCES", "registry")
    empty = _told(["pull", "qwen3-8b"])
    assert "cannot reach the registry" in empty and "OSCAR_ZOO_OFFLINE" not in empty
    _cache_something(cache_root)
    for args, hinted in ((["list"], True), (["list", "smollm2*"], True),
                         (["list", "qwen3-*"], False), (["list", "--validated"], False),
                         (["show", "smollm2-135m"], True), (["show", "qwen3-8b"], False)):
        told = CliRunner().invoke(cli, args)
        assert told.exit_code == 0, (args, told.output)
        assert "cannot reach the registry" in told.stderr, (args, told.stderr)
        assert ("set OSCAR_ZOO_OFFLINE=1 to read only the local cache" in told.stderr) is hinted, \
            (args, told.stderr)
    # pull falls back to the cache by itself: never the hint, cached or not
    for spec in ("qwen3-8b", "smollm2-135m@7"):
        assert "OSCAR_ZOO_OFFLINE" not in _told(["pull", spec])


def test_show_answers_from_the_cache_for_a_model_only_a_registry_knows(monkeypatch, cache_root):
    """Pulled from a registry earlier (no catalog entry), then the registry is down: `show`
    said "unknown model" though the cache holds it, and the hint that pointed at the cache."""
    import json

    (cache_root / "models" / "acme-model" / "snapshots" / ("b" * 64)).mkdir(parents=True)
    monkeypatch.setenv("OSCAR_ZOO_ENDPOINT", DEAD)
    monkeypatch.setenv("OSCAR_ZOO_HTTP_RETRIES", "0")
    told = CliRunner().invoke(cli, ["show", "acme-model", "--json"])
    assert told.exit_code == 0, told.output
    assert [c["digest"] for c in json.loads(told.stdout)["cache"]] == ["b" * 64]
    assert "set OSCAR_ZOO_OFFLINE=1" in told.stderr
    monkeypatch.setenv("OSCAR_ZOO_OFFLINE", "1")
    assert CliRunner().invoke(cli, ["show", "acme-model"]).exit_code == 0
    unknown = CliRunner().invoke(cli, ["show", "acme-other"])
    assert unknown.exit_code == 1 and "unknown model" in unknown.stderr
