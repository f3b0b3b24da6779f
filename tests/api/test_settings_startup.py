"""A bad value of a setting the registry reads is refused at startup (create_app, `oscar-zoo
serve`) with the variable, the value and what is valid. Set while the server runs (settings are
read when used), it answers 500 problem+json naming it, never a bare "Internal Server Error"."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
import uvicorn
from click.testing import CliRunner

from oscar_zoo.api.app import create_app
from oscar_zoo.zoo.cli.main import cli
from oscar_zoo.zoo.errors import ConfigError
from tests.utils.bundles import make_bundle
from tests.utils.registry_server import upload_bundle

BAD = [
    ("OSCAR_ZOO_MAX_UPLOAD_BYTES", "abc", "is not a valid int"),
    ("OSCAR_ZOO_MAX_UPLOAD_BYTES", "0", "out of range: it must be a finite number >0"),
    ("OSCAR_ZOO_MAX_UPLOAD_BYTES", "-5", "out of range: it must be a finite number >0"),
    ("OSCAR_ZOO_JOB_LEASE_SECONDS", "soon", "is not a valid float"),
    ("OSCAR_ZOO_JOB_MAX_ATTEMPTS", "0", "finite number >=1"),
    ("OSCAR_ZOO_JOB_CANCEL_GRACE_SECONDS", "-1", "finite number >=0"),
    ("OSCAR_ZOO_WORKERS", "two", "is not a valid int"),
    ("OSCAR_ZOO_RAY_INFEASIBLE_SECONDS", "nan", "finite number >0"),
    ("OSCAR_ZOO_EXECUTOR", "dask", "is not one of local, ray"),
    ("OSCAR_ZOO_MIRROR_TARGETS", "glm-*=hf:no-slash", "bad mirror target 'hf:no-slash'"),
    ("OSCAR_ZOO_PUBLIC_URL", "10.0.0.1:8000", "not an http(s) URL"),
]


@pytest.mark.parametrize("env, value, says", BAD, ids=[f"{e[10:]}={v}" for e, v, _ in BAD])
def test_create_app_refuses_a_bad_setting_before_opening_the_database(monkeypatch, sandbox,
                                                                      env, value, says):
    monkeypatch.setenv(env, value)
    with pytest.raises(ConfigError) as e:
        create_app()
    assert f"{env}={value!r}" in str(e.value) and says in str(e.value)
    assert not (sandbox / "data").exists()      # nothing created, nothing migrated


@pytest.fixture
def uvicorn_runs(monkeypatch) -> list:
    """Stands in for uvicorn's loop: `serve` returns once it would start serving."""
    runs = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, sockets=None: runs.append(self))
    return runs


def test_serve_refuses_to_start_naming_every_bad_setting(monkeypatch, sandbox, uvicorn_runs):
    monkeypatch.setenv("OSCAR_ZOO_MAX_UPLOAD_BYTES", "abc")
    monkeypatch.setenv("OSCAR_ZOO_JOB_MAX_ATTEMPTS", "0")
    out = CliRunner().invoke(cli, ["serve", "--port", "0", "--no-workers"])
    assert out.exit_code == 1 and isinstance(out.exception, SystemExit), out.output
    assert "Traceback" not in out.output and not uvicorn_runs
    assert out.stderr.startswith("Error: 2 settings are invalid")
    assert "OSCAR_ZOO_MAX_UPLOAD_BYTES='abc' is not a valid int" in out.stderr
    assert "OSCAR_ZOO_JOB_MAX_ATTEMPTS='0' is out of range" in out.stderr
    assert not (sandbox / "data").exists()


def test_serve_starts_with_valid_settings(monkeypatch, uvicorn_runs):
    monkeypatch.setenv("OSCAR_ZOO_MAX_UPLOAD_BYTES", "1000")
    monkeypatch.setenv("OSCAR_ZOO_MIRROR_TARGETS", "hf:org/rotations,glm-*=modelscope:org/glm")
    monkeypatch.setenv("OSCAR_ZOO_PUBLIC_URL", "http://10.0.0.1:8000")
    out = CliRunner().invoke(cli, ["serve", "--port", "0", "--no-workers"])
    assert out.exit_code == 0, out.output
    assert len(uvicorn_runs) == 1


def test_serve_with_ray_workers_and_no_cluster_address_is_refused_before_it_starts(monkeypatch,
                                                                                   uvicorn_runs):
    """It failed inside the app's startup instead: a traceback and exit code 3."""
    monkeypatch.setenv("OSCAR_ZOO_EXECUTOR", "ray")
    monkeypatch.delenv("OSCAR_ZOO_RAY_ADDRESS", raising=False)
    out = CliRunner().invoke(cli, ["serve", "--port", "0"])
    assert out.exit_code == 1 and not uvicorn_runs, out.output
    assert out.stderr.startswith("Error: OSCAR_ZOO_EXECUTOR=ray needs OSCAR_ZOO_RAY_ADDRESS")
    assert CliRunner().invoke(cli, ["serve", "--port", "0", "--no-workers"]).exit_code == 0


def test_serve_as_a_process_exits_1_with_one_line(tmp_path):
    env = {**os.environ, "OSCAR_ZOO_DATA_DIR": str(tmp_path / "data"),
           "OSCAR_ZOO_MAX_UPLOAD_BYTES": "-5"}
    # unchecked, the server would start and serve: the timeout fails the test
    done = subprocess.run([sys.executable, "-m", "oscar_zoo.zoo.cli.main", "serve", "--port", "0",
                           "--no-workers"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines() == [
        "Error: OSCAR_ZOO_MAX_UPLOAD_BYTES='-5' is out of range: it must be a finite number >0 "
        "(Largest request body the registry accepts.)"]


def test_a_bad_upload_limit_set_while_serving_is_a_500_problem_naming_it(
        publisher, tmp_path, monkeypatch, caplog, snapshot):
    server, http = publisher
    make_bundle(tmp_path / "b")
    before = snapshot(server)
    monkeypatch.setenv("OSCAR_ZOO_MAX_UPLOAD_BYTES", "abc")
    with caplog.at_level(logging.ERROR, logger="oscar_zoo.api"):
        r = upload_bundle(http, tmp_path / "b")
    assert r.status_code == 500, r.text
    assert r.headers["content-type"] == "application/problem+json"
    assert r.json() == {"type": "about:blank", "title": "Invalid configuration", "status": 500,
                        "detail": "OSCAR_ZOO_MAX_UPLOAD_BYTES='abc' is not a valid int: use a "
                                  "whole number >0 (Largest request body the registry accepts.)",
                        "instance": "/v1/models/smollm2-135m/versions"}
    assert any("OSCAR_ZOO_MAX_UPLOAD_BYTES='abc'" in rec.getMessage() for rec in caplog.records)
    # a body the server never reads: the client still gets the answer, not a reset
    r = http.post("/v1/models/smollm2-135m/versions", content=b"x" * (16 << 20),
                  headers={"Content-Type": "multipart/form-data; boundary=x"})
    assert r.status_code == 500 and "OSCAR_ZOO_MAX_UPLOAD_BYTES" in r.json()["detail"]
    assert http.get("/v1/health").status_code == 200      # routes without uploads go on
    assert snapshot(server) == before
    monkeypatch.setenv("OSCAR_ZOO_MAX_UPLOAD_BYTES", str(64 << 20))
    assert upload_bundle(http, tmp_path / "b").status_code == 201


def test_a_bad_job_setting_set_while_serving_is_500_not_the_clients_422(registry_server,
                                                                        monkeypatch):
    with registry_server.client(registry_server.token("jobs:submit")) as sub:
        monkeypatch.setenv("OSCAR_ZOO_JOB_MAX_ATTEMPTS", "0")
        r = sub.post("/v1/jobs", json={"model": "smollm2-135m"})
        assert r.status_code == 500, r.text
        assert r.headers["content-type"] == "application/problem+json"
        assert "OSCAR_ZOO_JOB_MAX_ATTEMPTS='0' is out of range" in r.json()["detail"]
        monkeypatch.setenv("OSCAR_ZOO_JOB_MAX_ATTEMPTS", "2")
        assert sub.get("/v1/jobs").json()["items"] == []
        assert sub.post("/v1/jobs", json={"model": "smollm2-135m"}).status_code == 201
