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
