"""`oscar-zoo publish BUNDLE --name OTHER`, OTHER not the bundle's model: the registry's refusal
ended in its API's fix ("upload it to /v1/models/smollm2-135m/versions"), a REST path, where
the command's fix is to drop --name or name the bundle's model."""

from __future__ import annotations

from click.testing import CliRunner

from oscar_zoo.zoo.cli.main import cli
from tests.utils.bundles import make_bundle


def test_publish_under_another_name_says_the_commands_fix(registry, tmp_path, monkeypatch):
    bundle = make_bundle(tmp_path / "smol").path
    monkeypatch.setenv("OSCAR_ZOO_TOKEN", registry.token("bundles:publish"))
    r = CliRunner().invoke(cli, ["publish", str(bundle), "--name", "brand-new-model"])
    assert r.exit_code == 1, r.output
    said = " ".join(r.stderr.split())
    assert "this bundle is for smollm2-135m" in said and "not 'brand-new-model'" in said, said
    assert said.endswith("; drop --name (publish takes the model from bundle.json, "
                         "smollm2-135m), or pass --name smollm2-135m"), said
    assert "/v1/models" not in said
    r = CliRunner().invoke(cli, ["publish", str(bundle), "--name", "smollm2-135m"])
    assert r.exit_code == 0 and "published smollm2-135m v1" in r.stdout, r.output
