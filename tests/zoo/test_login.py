"""`oscar-zoo login` refuses a token that is not shaped like a registry token before storing
anything, by the registry's own rule (the one whoami's "malformed token" comes from), and says
so when, with no registry configured, it stores a token it could not check."""

from __future__ import annotations

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
