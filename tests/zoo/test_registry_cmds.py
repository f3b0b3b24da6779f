"""`oscar-zoo tokens create|list|revoke` (zoo/cli/registry_cmds.py) act on this host's registry
database: they say which one, and a client of a remote registry (OSCAR_ZOO_ENDPOINT) is refused
rather than given a token in a new database that registry never heard of."""

from __future__ import annotations

import json
from contextlib import contextmanager
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from oscar_zoo.zoo.cli.main import cli

COMMANDS = [["tokens", "create", "--scope", "admin"], ["tokens", "list"],
            ["tokens", "revoke", "ci"]]


def _database(sandbox):
    return sandbox / "data" / "registry.sqlite"


def _default_database(sandbox, monkeypatch):
    """The database of the default data dir ($XDG_DATA_HOME/oscar-zoo), OSCAR_ZOO_DATA_DIR unset
    as a client host has it (the sandbox sets it)."""
    monkeypatch.delenv("OSCAR_ZOO_DATA_DIR")
    return sandbox / "xdg-data" / "oscar-zoo" / "registry.sqlite"


@pytest.mark.parametrize("args", COMMANDS)
def test_a_client_of_a_remote_registry_is_refused_and_nothing_is_made_here(sandbox, monkeypatch,
                                                                           args):
    """`tokens create` made a new SQLite registry in the data dir and minted a token there,
    which the remote registry refused; its 401 then said to run `tokens create`: a loop."""
    database = _default_database(sandbox, monkeypatch)
    monkeypatch.setenv("OSCAR_ZOO_ENDPOINT", "http://ops:Hunter2pw@registry.example:8000")
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1 and "ozk_" not in result.stdout, result.output
    said = " ".join(result.stderr.split())
    assert said.startswith("Error: OSCAR_ZOO_ENDPOINT points at the registry "
                           "http://ops:***@registry.example:8000"), said
    assert "Hunter2pw" not in said and str(database) in said
    assert "created on the registry's host" in said and "OSCAR_ZOO_DATABASE_URL" in said
    assert not database.exists()


def test_the_registrys_own_host_with_its_endpoint_set_keeps_its_database(sandbox, monkeypatch):
    """The registry's host often exports its own LAN address or service name as the endpoint
    (for its CLI and workers): its operator must still make and revoke tokens there, told
    which database they go to."""
    database = _default_database(sandbox, monkeypatch)
    runner = CliRunner()
    made = runner.invoke(cli, ["tokens", "create", "--scope", "admin", "--name", "ci"])
    assert made.exit_code == 0 and database.is_file(), made.output
    monkeypatch.setenv("OSCAR_ZOO_ENDPOINT", "http://registry-host.lan:8000")
    for args in (["tokens", "list", "--json"], ["tokens", "revoke", "ci"]):
        result = runner.invoke(cli, args)
        assert result.exit_code == 0, result.output
        said = " ".join(result.stderr.split())
        assert f"warning: acting on this host's registry database ({database})" in said, said
        assert f"registry database: sqlite:///{database}" in said, said


def test_each_command_says_which_database_it_acts_on(sandbox, monkeypatch):
    runner = CliRunner()
    made = runner.invoke(cli, ["tokens", "create", "--scope", "admin", "--name", "ci"])
    assert made.exit_code == 0, made.output
    where = f"registry database: sqlite:///{_database(sandbox)}"
    assert made.stderr.startswith(f"new {where}\n"), made.stderr     # the first one makes it
    # `serve` on this host with OSCAR_ZOO_DATA_DIR, its endpoint exported (the README's order,
    # the demo): its database, no warning
    monkeypatch.setenv("OSCAR_ZOO_ENDPOINT", "http://localhost:8000")
    for args in (["tokens", "list", "--json"], ["tokens", "revoke", "ci"]):
        result = runner.invoke(cli, args)
        assert result.exit_code == 0, result.output
        assert result.stderr.startswith(f"{where}\n"), result.stderr
    assert json.loads(runner.invoke(cli, ["tokens", "list", "--json"]).stdout)[0]["name"] == "ci"


def test_a_database_named_explicitly_is_used_whatever_the_endpoint(sandbox, tmp_path,
                                                                    monkeypatch):
    """OSCAR_ZOO_DATABASE_URL says which database is meant: the registry's own, reached from
    another host, is how a client host may make its tokens."""
    url = f"sqlite:///{tmp_path / 'elsewhere.sqlite'}"
    monkeypatch.setenv("OSCAR_ZOO_DATABASE_URL", url)
    monkeypatch.setenv("OSCAR_ZOO_ENDPOINT", "http://registry.example:8000")
    result = CliRunner().invoke(cli, ["tokens", "create", "--scope", "admin"])
    assert result.exit_code == 0, result.output
    assert result.stderr.startswith(f"registry database: {url}\n"), result.stderr
    assert result.stdout.startswith("ozk_") and not _database(sandbox).exists()


def test_the_database_is_named_with_its_password_masked(monkeypatch):
    from oscar_zoo.registry_db import registry, tokens

    @contextmanager
    def read():
        yield None

    db = SimpleNamespace(url="postgresql+psycopg://ops:Hunter2pw@db.internal:5432/registry",
                         read=read)
    monkeypatch.setenv("OSCAR_ZOO_DATABASE_URL", "postgresql://ops:Hunter2pw@db.internal/registry")
    monkeypatch.setattr(registry, "open_registry", lambda: SimpleNamespace(db=db))
    monkeypatch.setattr(tokens, "list_tokens", lambda session: [])
    result = CliRunner().invoke(cli, ["tokens", "list"])
    assert result.exit_code == 0, result.output
    assert "registry database: postgresql+psycopg://ops:***@db.internal:5432/registry" \
        in result.stderr
    assert "Hunter2pw" not in result.output + result.stderr


def test_db_upgrade_to_an_unknown_revision_is_one_line(sandbox):
    """It was Alembic's traceback, ending "CommandError: Can't locate revision ..."."""
    from oscar_zoo.registry_db import migrate

    result = CliRunner().invoke(cli, ["db", "upgrade", "--revision", "bogus"])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    said = result.stderr.strip()
    assert said.startswith("Error: schema revision 'bogus': Can't locate revision") and \
        "\n" not in said, said
    assert f"0001 to {migrate.head()}" in said
