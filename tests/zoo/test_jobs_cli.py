"""`oscar-zoo jobs` input checks that need no registry."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from oscar_zoo.zoo.cli.main import cli


@pytest.mark.parametrize("text, why", [("{model: qwen3-8b}", "is not JSON"),
                                       ('["qwen3-8b"]', "must hold a JSON object")])
def test_a_bad_spec_file_is_a_usage_error(tmp_path, monkeypatch, text, why):
    monkeypatch.setenv("OSCAR_ZOO_ENDPOINT", "http://127.0.0.1:9")  # never reached
    spec = tmp_path / "job.json"
    spec.write_text(text)
    result = CliRunner().invoke(cli, ["jobs", "submit", "--spec", str(spec)])
    assert result.exit_code == 2 and "--spec" in result.stderr and why in result.stderr, result.output


def test_a_job_id_cannot_reach_another_endpoint(tmp_path, monkeypatch, hub):
    from tests.utils.databases import fresh_database
    from tests.utils.registry_server import run_registry

    with fresh_database("sqlite", tmp_path) as url, run_registry(url, tmp_path / "reg") as server:
        monkeypatch.setenv("OSCAR_ZOO_ENDPOINT", server.url)
        for cmd in ("status", "cancel"):  # ../models/x was the model's detail page
            result = CliRunner().invoke(cli, ["jobs", cmd, "../models/glm-4.7-fp8"])
            assert isinstance(result.exception, SystemExit) and result.exit_code == 1, result.output
            assert result.stderr.startswith("Error: registry") and "/docs" in result.stderr


def test_submit_warns_when_no_worker_seen_lately_can_run_the_job(tmp_path, monkeypatch, hub):
    import json

    from tests.utils.databases import fresh_database
    from tests.utils.registry_server import run_registry

    with fresh_database("sqlite", tmp_path) as url, run_registry(url, tmp_path / "reg") as server:
        monkeypatch.setenv("OSCAR_ZOO_ENDPOINT", server.url)
        monkeypatch.setenv("OSCAR_ZOO_TOKEN", server.token("jobs:submit"))
        result = CliRunner().invoke(cli, ["jobs", "submit", "glm-4.7-fp8"])   # 8 GPUs
        assert result.exit_code == 0, result.output
        assert "cannot start yet: no worker has asked for work" in result.stderr
        assert "waiting     no worker has asked" in result.stdout
        job_id = result.stdout.split()[1]
        server.client(server.token("jobs:work")).post(
            "/v1/workers/claim", json={"worker": "w", "gpus": 2}).raise_for_status()
        shown = CliRunner().invoke(cli, ["jobs", "status", job_id, "--json"])
        assert "needs 8 GPUs" in json.loads(shown.stdout)["waiting"], shown.output
