"""The write side's auth and upload checks, over real HTTP: what a token's holder or an
anonymous reader can learn, and which multipart file names reach the staging dir."""

from __future__ import annotations

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
