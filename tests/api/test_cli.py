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
