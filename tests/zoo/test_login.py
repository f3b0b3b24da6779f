"""`oscar-zoo login` refuses a token that is not shaped like a registry token before storing
anything, by the registry's own rule (the one whoami's "malformed token" comes from), and says
so when, with no registry configured, it stores a token it could not check. A token lacking the
scope a write needs is told what to ask the registry's operator for; `oscar-zoo logout` forgets
the stored token."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from oscar_zoo.zoo.cli.main import cli

GOOD = "ozk_" + "A" * 43       # the shape registry_db.tokens creates: ozk_ + 43 url-safe characters


def _stored(sandbox) -> str | None:
    path = sandbox / "config" / "token"
    return path.read_text().strip() if path.exists() else None


def test_a_malformed_token_is_refused_and_the_stored_one_kept(sandbox, monkeypatch):
    """The walkthrough: `login --token ozk_bad` with no OSCAR_ZOO_ENDPOINT exited 0 and stored
    it over a working token; only `whoami` then said "malformed token"."""
    monkeypatch.delenv("OSCAR_ZOO_ENDPOINT", raising=False)
    assert CliRunner().invoke(cli, ["login", "--token", GOOD]).exit_code == 0
    for bad in ("ozk_bad", GOOD + "x", "Bearer " + GOOD, GOOD[:-1] + "!"):
        result = CliRunner().invoke(cli, ["login", "--token", bad])
        assert result.exit_code == 1, result.output
        assert "malformed token: registry tokens look like ozk_ followed by 43 characters" \
            in result.stderr
        assert "nothing was stored" in result.stderr and bad not in result.output
        assert _stored(sandbox) == GOOD


def test_a_token_stored_without_a_registry_is_said_to_be_unverified(sandbox, monkeypatch):
    monkeypatch.delenv("OSCAR_ZOO_ENDPOINT", raising=False)
    result = CliRunner().invoke(cli, ["login", "--token", GOOD])
    assert result.exit_code == 0 and _stored(sandbox) == GOOD
    assert "warning: no registry configured (OSCAR_ZOO_ENDPOINT), so the token was stored " \
           "unverified" in result.stderr
    assert result.stdout == ""      # stdout is for data; login has none


def test_a_malformed_token_is_refused_before_any_request(sandbox, monkeypatch):
    """With a registry set, the shape is checked first: no request carries the token."""
    monkeypatch.setenv("OSCAR_ZOO_ENDPOINT", "http://127.0.0.1:1")    # nothing listens
    result = CliRunner().invoke(cli, ["login", "--token", "ozk_bad"])
    assert result.exit_code == 1 and "malformed token" in result.stderr, result.output
    assert "cannot reach" not in result.stderr and _stored(sandbox) is None


# --- a token without the scope a write needs (403) ---------------------------------------------

def _publish_with(registry, tmp_path, monkeypatch, from_env: bool):
    """`oscar-zoo publish` against the real registry with a token holding jobs:submit only."""
    from tests.utils.bundles import make_bundle

    token = registry.token("jobs:submit", name="ci")
    if from_env:
        monkeypatch.setenv("OSCAR_ZOO_TOKEN", token)
    else:
        assert CliRunner().invoke(cli, ["login", "--token", token]).exit_code == 0
    return token, CliRunner().invoke(cli, ["publish", str(make_bundle(tmp_path / "b").path)])


@pytest.mark.parametrize("from_env", [False, True])
def test_a_token_lacking_a_scope_is_told_what_to_ask_the_registrys_operator_for(
        registry, tmp_path, monkeypatch, from_env):
    """The 403 sent the user to `oscar-zoo tokens create`, the registry host operator's command
    (run here, it makes a token in this host's database), without saying it is the operator's."""
    from oscar_zoo.zoo.cli.registry_cmds import tokens_create

    token, result = _publish_with(registry, tmp_path, monkeypatch, from_env)
    assert result.exit_code == 1, result.output
    then = ("then set OSCAR_ZOO_TOKEN to it (it overrides the token `oscar-zoo login` stores)"
            if from_env else "then `oscar-zoo login` with it")
    assert (f"Error: registry {registry.url}: the token lacks scope bundles:publish (its scopes: "
            "jobs:submit); ask the registry's operator for a token with bundles:publish (on the "
            "registry host: `oscar-zoo tokens create --scope bundles:publish ...`), "
            f"{then}") in result.stderr, result.stderr
    assert result.stderr.count("tokens create") == 1 and token not in result.output
    # the command suggested is spelled as the registry host's CLI takes it
    assert "--scope" in {o for p in tokens_create.params for o in p.opts}


# --- logout ------------------------------------------------------------------------------------

def test_logout_removes_the_stored_token_and_says_so_on_stderr(sandbox, monkeypatch):
    from oscar_zoo.zoo.registry_client import current_token

    assert CliRunner().invoke(cli, ["login", "--token", GOOD]).exit_code == 0
    assert current_token() == GOOD
    result = CliRunner().invoke(cli, ["logout"])
    assert result.exit_code == 0, result.output
    path = sandbox / "config" / "token"
    assert f"logged out: removed the token stored in {path}" in result.stderr
    assert result.stdout == "" and GOOD not in result.output and "warning" not in result.stderr
    assert _stored(sandbox) is None and current_token() is None


def test_logout_without_a_stored_token_says_so_and_succeeds(sandbox):
    for _ in range(2):
        result = CliRunner().invoke(cli, ["logout"])
        assert result.exit_code == 0, result.output
        assert f"not logged in: no token stored in {sandbox / 'config' / 'token'}" in result.stderr


def test_logout_uses_the_config_dir_setting(sandbox, monkeypatch, tmp_path):
    """The token is where OSCAR_ZOO_CONFIG_DIR says, as login stored it; another dir's is kept."""
    assert CliRunner().invoke(cli, ["login", "--token", GOOD]).exit_code == 0
    monkeypatch.setenv("OSCAR_ZOO_CONFIG_DIR", str(tmp_path / "elsewhere"))
    assert CliRunner().invoke(cli, ["login", "--token", "ozk_" + "B" * 43]).exit_code == 0
    result = CliRunner().invoke(cli, ["logout"])
    assert result.exit_code == 0 and str(tmp_path / "elsewhere" / "token") in result.stderr
    assert not (tmp_path / "elsewhere" / "token").exists() and _stored(sandbox) == GOOD


def test_logout_warns_that_a_token_in_the_environment_is_still_sent(sandbox, monkeypatch):
    assert CliRunner().invoke(cli, ["login", "--token", GOOD]).exit_code == 0
    env_token = "ozk_" + "E" * 43
    monkeypatch.setenv("OSCAR_ZOO_TOKEN", env_token + "\n")
    result = CliRunner().invoke(cli, ["logout"])
    assert result.exit_code == 0 and _stored(sandbox) is None, result.output
    assert ("warning: OSCAR_ZOO_TOKEN is set, and its token is still sent with every request "
            "(it overrides the stored one); logout cannot unset it: run `unset OSCAR_ZOO_TOKEN` "
            "in your shell") in result.stderr, result.stderr
    assert env_token not in result.output


def test_logout_json(sandbox, monkeypatch):
    import json

    assert CliRunner().invoke(cli, ["login", "--token", GOOD]).exit_code == 0
    monkeypatch.setenv("OSCAR_ZOO_TOKEN", GOOD)
    path = str(sandbox / "config" / "token")
    first = CliRunner().invoke(cli, ["logout", "--json"])
    second = CliRunner().invoke(cli, ["logout", "--json"])
    assert first.exit_code == second.exit_code == 0
    assert json.loads(first.stdout) == {"removed": True, "path": path, "warnings": [
        "OSCAR_ZOO_TOKEN is set, and its token is still sent with every request (it overrides "
        "the stored one); logout cannot unset it: run `unset OSCAR_ZOO_TOKEN` in your shell"]}
    assert json.loads(second.stdout)["removed"] is False
    assert "warning" not in first.stderr        # the JSON carries it, once
