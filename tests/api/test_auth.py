"""The write side's auth and upload checks, over real HTTP: what a token's holder or an
anonymous reader can learn, which multipart file names reach the staging dir, and how the
client keeps and sends its token."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from oscar_zoo.registry_db.models import ApiToken, AuditEvent
from tests.utils.bundles import make_bundle
from tests.utils.registry_server import BUNDLE_FILES, upload_bundle


def test_an_unnamed_token_leaks_none_of_its_characters(registry_server, tmp_path):
    """A token created without --name was named `token-` + its characters 4..10, and that
    name is the actor of its writes: the public `created_by` of every version it published
    (and the audit log) gave anyone 36 bits of the secret."""
    token = registry_server.token("bundles:publish", name="")
    secret = token[len("ozk_"):]
    make_bundle(tmp_path / "b")
    with registry_server.client(token) as http:
        r = upload_bundle(http, tmp_path / "b")
    assert r.status_code == 201, r.text
    with registry_server.client() as anon:
        shown = anon.get("/v1/models/smollm2-135m/versions/1").json()["created_by"]
    with registry_server.registry.db.read() as session:
        row = session.scalar(select(ApiToken))
        audit = [(a.actor, a.detail) for a in session.scalars(select(AuditEvent))]
    assert shown == f"token:token-{row.id}" and row.name == f"token-{row.id}"
    for text in [shown, row.name, repr(audit)]:
        assert not any(secret[i:i + 6] in text for i in range(len(secret) - 5)), text


def _legacy_named(registry_server, scope: str) -> str:
    """A token named as tokens were by default before: `token-` + characters 4..10 of it."""
    from sqlalchemy import update

    token = registry_server.token(scope, name="")
    with registry_server.registry.db.write() as session:
        session.execute(update(ApiToken).values(name=f"token-{token[4:10]}"))
    return token


def test_a_legacy_default_name_is_not_the_actor(registry_server, tmp_path):
    """Tokens named the old way keep their name, but their writes from now on show the id."""
    token = _legacy_named(registry_server, "bundles:publish")
    make_bundle(tmp_path / "b")
    with registry_server.client(token) as http:
        r = upload_bundle(http, tmp_path / "b")
    assert r.status_code == 201, r.text
    assert token[4:10] not in r.json()["created_by"]
    assert r.json()["created_by"].startswith("token:token-")


def _part(name: str, filename: str, data: bytes) -> bytes:
    return (f'--x\r\nContent-Disposition: form-data; name="{name}"; filename="{filename}"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n").encode() + data + b"\r\n"


def test_a_file_name_ending_in_a_newline_is_an_unsafe_path(publisher, tmp_path, snapshot):
    """`^...$` matched `README.md\\n` (`$` matches before a final newline): the name passed as
    a plain file name and was written into the staging dir, and the upload failed later as an
    'unlisted file' instead of an unsafe name. httpx escapes the newline, so the body is raw."""
    server, http = publisher
    make_bundle(tmp_path / "b")
    before = snapshot(server)
    body = b"".join(_part(n, n, (tmp_path / "b" / n).read_bytes()) for n in BUNDLE_FILES)
    for extra in (_part("files", "README.md\n", b"x"), _part("README.md\n", "a", b"x")):
        r = http.post("/v1/models/smollm2-135m/versions", content=body + extra + b"--x--\r\n",
                      headers={"Content-Type": "multipart/form-data; boundary=x"})
        assert r.status_code == 400, r.text
        assert r.json()["title"] == "Unsafe path"
    assert snapshot(server) == before


def test_tokens_revoke_takes_the_leaked_token_and_does_not_print_it(registry_db_url, monkeypatch):
    """`oscar-zoo tokens revoke ozk_...` failed and printed the whole secret on stderr."""
    from click.testing import CliRunner

    from oscar_zoo.zoo.cli.main import cli

    monkeypatch.setenv("OSCAR_ZOO_DATABASE_URL", registry_db_url)
    runner = CliRunner()
    token = runner.invoke(cli, ["tokens", "create", "--scope", "admin"]).stdout.strip()
    revoked = runner.invoke(cli, ["tokens", "revoke", token])
    assert revoked.exit_code == 0, revoked.output
    again = runner.invoke(cli, ["tokens", "revoke", token])
    assert again.exit_code == 1 and "no live token" in again.stderr
    listed = runner.invoke(cli, ["tokens", "list", "--json"]).stdout
    assert '"revoked_at": null' not in listed
    for output in (revoked.output, again.output, listed):
        assert token not in output and token[4:10] not in output.replace(token[:12], "")


def test_a_wrong_scope_says_how_to_get_it_without_the_tokens_characters(registry_server, tmp_path):
    """The 403 named the token by its stored name, which for a token named the old way is
    `token-` + characters 4..10 of the secret (the actor shows it by id instead), and said
    which scope was missing but not how to get a token holding it."""
    token = _legacy_named(registry_server, "jobs:submit")
    make_bundle(tmp_path / "b")
    with registry_server.client(token) as http:
        r = upload_bundle(http, tmp_path / "b")
    assert r.status_code == 403, r.text
    detail = r.json()["detail"]
    assert token[4:10] not in detail and "token:token-" in detail, detail
    assert "oscar-zoo tokens create --scope bundles:publish" in detail, detail


def test_a_wrong_scope_names_the_scope_needed_and_the_tokens_scopes_in_the_body(registry_server,
                                                                              tmp_path):
    """The 403 said which scope was missing in prose only: a client could not tell its user what
    to ask the registry's operator for without parsing the detail. The body names the token's
    scopes, never the token."""
    token = registry_server.token("jobs:submit", "jobs:work", name="ci")
    make_bundle(tmp_path / "b")
    with registry_server.client(token) as http:
        r = upload_bundle(http, tmp_path / "b")
        moved = http.put("/v1/models/smollm2-135m/aliases/recommended", json={"version": 1})
    assert r.status_code == 403 and r.headers["content-type"] == "application/problem+json"
    body = r.json()
    assert body["required_scope"] == "bundles:publish", body
    assert body["token_scopes"] == ["jobs:submit", "jobs:work"], body
    assert "on the registry's host: `oscar-zoo tokens create --scope bundles:publish ...`" \
        in body["detail"], body
    assert token[4:] not in r.text and token[4:12] not in r.text
    assert moved.status_code == 403 and moved.json()["required_scope"] == "bundles:publish"


def test_an_expired_token_is_refused_with_401_saying_when_and_what_to_do(registry_server,
                                                                         tmp_path):
    """Tokens never expired. Refused, the holder is told when it expired and how to get a new
    one, but nothing else of it; an unknown token still learns nothing."""
    from datetime import datetime, timedelta, timezone

    from oscar_zoo.registry_db.tokens import create_token

    with registry_server.registry.db.write() as session:
        row, token = create_token(session, ["bundles:publish", "jobs:work"], "nightly-bot",
                                  expires_in=timedelta(days=1))
        token_id = row.id
    make_bundle(tmp_path / "b")
    with registry_server.client(token) as http:
        assert http.get("/v1/whoami").status_code == 200
    at = datetime.now(timezone.utc) - timedelta(minutes=1)
    with registry_server.registry.db.write() as session:
        session.get(ApiToken, token_id).expires_at = at
    with registry_server.client(token) as http:
        refused = [http.get("/v1/whoami"), upload_bundle(http, tmp_path / "b"),
                   http.post("/v1/workers/claim", json={"worker": "w1", "gpus": 0})]
    for r in refused:
        assert r.status_code == 401, r.text
        detail = r.json()["detail"]
        assert f"expired at {at.isoformat(timespec='seconds')}" in detail, detail
        assert "oscar-zoo tokens create" in detail
        assert "nightly-bot" not in detail and "jobs:work" not in detail and token[4:12] not in detail
    with registry_server.client("ozk_" + "A" * 43) as http:     # unknown: as before
        assert "expired" not in http.get("/v1/whoami").json()["detail"]
    with registry_server.client() as anon:                       # nothing was published
        assert anon.get("/v1/models/smollm2-135m/versions/1").status_code == 404


@pytest.mark.parametrize("scheme", ["Token {}", "Basic {}", "{}", "Token"])
def test_a_scheme_other_than_bearer_is_told_to_use_bearer(registry_server, scheme):
    """HTTPBearer reads `Token X` as no Authorization header at all: the caller was told the
    endpoint "needs a token", which it had sent."""
    token = registry_server.token("bundles:publish", "jobs:submit")
    sent = {"Authorization": scheme.format(token)}
    with registry_server.client() as http:
        refused = [http.get("/v1/whoami", headers=sent),
                   http.post("/v1/jobs", json={"model": "smollm2-135m"}, headers=sent)]
    for r in refused:
        assert r.status_code == 401, r.text
        assert r.headers["www-authenticate"].startswith("Bearer")
        detail = r.json()["detail"]
        assert "needs a token" not in detail and "Authorization: Bearer ozk_..." in detail, detail
        assert token[4:] not in r.text, r.text


def test_the_bearer_scheme_is_any_case_and_no_header_still_needs_a_token(registry_server):
    token = registry_server.token("jobs:submit", name="ci")
    with registry_server.client() as http:
        for sent in (f"bearer {token}", f"BEARER {token}"):
            r = http.get("/v1/whoami", headers={"Authorization": sent})
            assert r.status_code == 200 and r.json()["actor"] == "token:ci", r.text
        for headers in ({}, {"Authorization": "Bearer"}):
            r = http.get("/v1/whoami", headers=headers)
            assert r.status_code == 401 and "needs a token" in r.json()["detail"], r.text


# --- the client's token ------------------------------------------------------------------------

def _client_env(monkeypatch, server, token: str | None) -> None:
    monkeypatch.setenv("OSCAR_ZOO_ENDPOINT", server.url)
    monkeypatch.setenv("OSCAR_ZOO_HTTP_RETRIES", "0")
    if token is not None:
        monkeypatch.setenv("OSCAR_ZOO_TOKEN", token)


def test_a_token_from_the_environment_is_sent_without_its_newline(registry_server, monkeypatch):
    """OSCAR_ZOO_TOKEN set from a secret file keeps the file's newline: the client sent it in
    the header, which is illegal, and every request, public reads too, failed as 'cannot
    reach the registry ... check OSCAR_ZOO_ENDPOINT and your network'."""
    from oscar_zoo.zoo.registry_client import RegistryClient

    token = registry_server.token("bundles:publish", name="ci")
    _client_env(monkeypatch, registry_server, token + "\n")
    with RegistryClient() as client:
        assert client.whoami()["actor"] == "token:ci"
        assert all("name" in m for m in client.models())     # a public read too


def test_a_refused_token_from_the_environment_says_to_fix_the_variable(registry_server,
                                                                       monkeypatch):
    """The 401 hint was `run oscar-zoo login again` whatever the token's source; with
    OSCAR_ZOO_TOKEN set that changes nothing (the variable overrides the stored token), so
    following the advice gave the same 401 again."""
    from oscar_zoo.registry_db.tokens import revoke_token
    from oscar_zoo.zoo.errors import Unauthorized
    from oscar_zoo.zoo.registry_client import RegistryClient, store_token

    stale = registry_server.token("bundles:publish", name="old")
    with registry_server.registry.db.write() as session:
        revoke_token(session, "old")
    _client_env(monkeypatch, registry_server, stale)
    with RegistryClient() as client:
        with pytest.raises(Unauthorized, match="token in OSCAR_ZOO_TOKEN was refused") as refused:
            client.whoami()
    assert "login` again" not in str(refused.value) and stale not in str(refused.value)
    monkeypatch.delenv("OSCAR_ZOO_TOKEN")
    store_token(stale)                  # the stored one: logging in again is the fix
    with RegistryClient() as client:
        with pytest.raises(Unauthorized, match="run `oscar-zoo login` again"):
            client.whoami()


def test_the_stored_token_is_never_written_through_a_file_already_there(tmp_path, monkeypatch):
    """store_token opened the fixed name .token.tmp without O_EXCL: a symlink there was
    followed (the token written into its target, keeping the target's mode) and then moved into
    place as the token file itself."""
    import os
    import stat

    from oscar_zoo.zoo.registry_client import current_token, store_token

    config = tmp_path / "config"
    config.mkdir()
    monkeypatch.setenv("OSCAR_ZOO_CONFIG_DIR", str(config))
    outside = tmp_path / "outside"
    outside.write_text("")
    outside.chmod(0o644)
    os.symlink(outside, config / ".token.tmp")
    token = "ozk_" + "A" * 43
    path = store_token(token + "\n")
    assert outside.read_text() == ""
    assert not path.is_symlink() and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text() == token + "\n" and current_token() == token
    assert sorted(p.name for p in config.iterdir()) == [".token.tmp", "token"]  # no temp file left
