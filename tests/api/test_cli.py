"""`oscar-zoo tokens|db|serve` against real databases; `serve` runs as a real process."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
from click.testing import CliRunner

from oscar_zoo.zoo.cli.main import cli
from tests.utils.bundles import make_bundle
from tests.utils.registry_server import free_socket, upload_bundle


def test_tokens_bootstrap_and_revoke(registry_db_url, monkeypatch):
    monkeypatch.setenv("OSCAR_ZOO_DATABASE_URL", registry_db_url)
    runner = CliRunner()
    created = runner.invoke(cli, ["tokens", "create", "--scope", "bundles:publish",
                                  "--scope", "jobs:submit", "--name", "ci"])
    assert created.exit_code == 0, created.output
    token = created.stdout.strip()
    assert token.startswith("ozk_") and len(token) == 47
    listed = runner.invoke(cli, ["tokens", "list", "--json"])
    assert '"ci"' in listed.stdout and token not in listed.stdout
    twin = runner.invoke(cli, ["tokens", "create", "--scope", "admin", "--name", "ci"])
    assert twin.exit_code == 1 and "a live token is already named 'ci'" in twin.stderr
    assert "oscar-zoo tokens revoke" in twin.stderr and "ozk_" not in twin.stdout
    assert runner.invoke(cli, ["tokens", "revoke", "ci"]).exit_code == 0
    again = runner.invoke(cli, ["tokens", "revoke", "ci"])
    assert again.exit_code == 1 and "no live token" in again.stderr
    bad = runner.invoke(cli, ["tokens", "create", "--scope", "root"])
    assert bad.exit_code == 2
    assert runner.invoke(cli, ["db", "upgrade"]).exit_code == 0


def test_tokens_expire_and_list_says_which_are_live(registry_db_url, monkeypatch):
    """Tokens never expired, and `tokens list` said only live or revoked."""
    import json
    from datetime import datetime, timedelta, timezone

    from oscar_zoo.registry_db.models import ApiToken
    from oscar_zoo.registry_db.session import Database

    monkeypatch.setenv("OSCAR_ZOO_DATABASE_URL", registry_db_url)
    runner = CliRunner()
    made = {}
    for name, expiry in [("soon", ["--expires-in", "12h"]), ("quarter", ["--expires-in", "90d"]),
                         ("forever", []), ("gone", ["--expires-in", "30m"])]:
        out = runner.invoke(cli, ["tokens", "create", "--scope", "jobs:work", "--name", name,
                                  *expiry])
        assert out.exit_code == 0, out.output
        made[name] = out
    assert "expires 20" in made["quarter"].stderr and "never expires" not in made["quarter"].stderr
    assert "never expires (--expires-in 90d" in made["forever"].stderr
    db = Database(registry_db_url)
    past = datetime.now(timezone.utc) - timedelta(hours=1)
    with db.write() as s:
        s.query(ApiToken).filter_by(name="soon").one().expires_at = past
    db.dispose()
    assert runner.invoke(cli, ["tokens", "revoke", "gone"]).exit_code == 0
    listed = {r["name"]: r for r in json.loads(runner.invoke(cli, ["tokens", "list", "--json"]).stdout)}
    assert {n: r["state"] for n, r in listed.items()} == {
        "soon": "expired", "quarter": "live", "forever": "live", "gone": "revoked"}
    assert listed["soon"]["expires_at"] == past.isoformat() and listed["forever"]["expires_at"] is None
    left = datetime.fromisoformat(listed["quarter"]["expires_at"]) - datetime.now(timezone.utc)
    assert timedelta(days=89) < left <= timedelta(days=90)
    human = {line.split()[2]: line for line in runner.invoke(cli, ["tokens", "list"]).stdout.splitlines()[1:]}
    assert human["soon"].endswith(f"expired {past.isoformat()[:19]}")
    assert human["quarter"].endswith(f"live until {listed['quarter']['expires_at'][:19]}")
    assert human["forever"].endswith("live") and " revoked 20" in human["gone"]
    taken = runner.invoke(cli, ["tokens", "create", "--scope", "jobs:work", "--name", "soon"])
    assert taken.exit_code == 1 and "keeps its name until it is revoked" in taken.stderr
    assert "oscar-zoo tokens revoke" in taken.stderr


def test_a_bad_expiry_is_refused_with_the_forms_it_takes(registry_db_url, monkeypatch):
    monkeypatch.setenv("OSCAR_ZOO_DATABASE_URL", registry_db_url)
    runner = CliRunner()
    forms = "m (minutes), h (hours), d (days) or w (weeks), e.g. 30m, 12h, 90d, 52w"
    for bad, says in [("1y", forms), ("90", forms), ("0d", "more than 0 and at most 3650d")]:
        out = runner.invoke(cli, ["tokens", "create", "--scope", "admin", "--expires-in", bad])
        assert out.exit_code == 2 and "ozk_" not in out.stdout, out.output
        stderr = " ".join(out.stderr.split())     # click wraps its usage errors
        assert "--expires-in" in stderr and says in stderr, stderr
    assert runner.invoke(cli, ["tokens", "list", "--json"]).stdout.strip() == "[]"


def test_tokens_list_has_a_header_row(registry_db_url, monkeypatch):
    """`tokens list` printed bare rows, unlike `list` and `cache ls`; --json stays rows only."""
    import json

    monkeypatch.setenv("OSCAR_ZOO_DATABASE_URL", registry_db_url)
    runner = CliRunner()
    assert runner.invoke(cli, ["tokens", "create", "--scope", "admin", "--name", "ci"]).exit_code == 0
    lines = runner.invoke(cli, ["tokens", "list"]).stdout.splitlines()
    assert lines[0].split() == ["ID", "PREFIX", "NAME", "SCOPES", "STATE"] and len(lines) == 2
    assert lines[1].index("ci") == lines[0].index("NAME")        # the columns line up
    assert lines[1].index("admin") == lines[0].index("SCOPES")
    assert lines[1].index("live") == lines[0].index("STATE")
    assert [r["name"] for r in json.loads(runner.invoke(cli, ["tokens", "list", "--json"]).stdout)] == ["ci"]


def test_tokens_create_json(registry_db_url, monkeypatch):
    """`tokens create` had no --json: a script had to take the token from bare text."""
    import json
    from datetime import datetime, timedelta, timezone

    monkeypatch.setenv("OSCAR_ZOO_DATABASE_URL", registry_db_url)
    runner = CliRunner()
    out = runner.invoke(cli, ["tokens", "create", "--scope", "jobs:work", "--scope", "admin",
                              "--name", "ci", "--expires-in", "12h", "--json"])
    assert out.exit_code == 0, out.output
    made = json.loads(out.stdout)
    assert made["token"].startswith("ozk_") and len(made["token"]) == 47
    assert made["name"] == "ci" and made["scopes"] == ["admin", "jobs:work"]
    left = datetime.fromisoformat(made["expires_at"]) - datetime.now(timezone.utc)
    assert timedelta(hours=11) < left <= timedelta(hours=12)
    assert "shown only this once" in out.stderr and made["token"] not in out.stderr
    listed = json.loads(runner.invoke(cli, ["tokens", "list", "--json"]).stdout)
    assert [(r["id"], r["prefix"]) for r in listed] == [(made["id"], made["token"][:12])]
    unnamed = json.loads(runner.invoke(cli, ["tokens", "create", "--scope", "admin", "--json"]).stdout)
    assert unnamed["name"] == f"token-{unnamed['id']}" and unnamed["expires_at"] is None


def test_serve_on_a_port_in_use_says_so_in_one_line():
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = CliRunner().invoke(cli, ["serve", "--port", str(port), "--no-workers"])
    assert out.exit_code == 1 and isinstance(out.exception, SystemExit), out.output
    assert f"cannot listen on 127.0.0.1:{port}" in out.stderr and "--port 0" in out.stderr


def test_serve_end_to_end(registry_db_url, tmp_path):
    env = {**os.environ, "OSCAR_ZOO_DATABASE_URL": registry_db_url,
           "OSCAR_ZOO_DATA_DIR": str(tmp_path / "data")}
    token = subprocess.run([sys.executable, "-m", "oscar_zoo.zoo.cli.main", "tokens", "create",
                            "--scope", "bundles:publish"], env=env, capture_output=True,
                           text=True, check=True).stdout.strip()
    sock = free_socket()
    port = sock.getsockname()[1]
    sock.close()
    proc = subprocess.Popen([sys.executable, "-m", "oscar_zoo.zoo.cli.main", "serve", "--port",
                             str(port), "--no-workers", "--log-level", "warning"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(200):
            try:
                if httpx.get(f"{url}/v1/health").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.05)
        make_bundle(tmp_path / "b")
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}) as http:
            assert upload_bundle(http, tmp_path / "b").status_code == 201
            assert http.get("/v1/models/smollm2/versions/latest").json()["version"] == 1
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=10)
    assert token not in out + err  # tokens never reach the logs


def test_the_access_log_leaves_out_idle_workers_polls():
    """Each local worker's 204 long poll filled the server log with ~12 lines a minute."""
    import logging

    from oscar_zoo.zoo.cli.registry_cmds import quiet_polls

    def line(path, status):
        return logging.LogRecord("uvicorn.access", logging.INFO, "", 0, '%s - "%s %s HTTP/%s" %d',
                                 ("127.0.0.1:1", "POST", path, "1.1", status), None)

    assert not quiet_polls(line("/v1/workers/claim", 204))
    assert quiet_polls(line("/v1/workers/claim", 200))            # a job handed out stays
    assert quiet_polls(line("/v1/models", 200))
