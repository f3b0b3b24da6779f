"""Which name a mirrored version goes by: always the registry's model name (tags, index slots,
target globs), whatever the bundle or the command line calls it; and a model never takes over
another model's folder. Real clients against the loopback emulator."""

from __future__ import annotations

import hashlib
import json

from click.testing import CliRunner

from oscar_zoo.zoo.cli.main import cli
from tests.utils.bundles import make_bundle
from tests.zoo.test_mirror import HF, REPO, TAG, registry  # noqa: F401 (fixture)


def test_the_cli_matches_target_globs_against_the_registrys_name(registry, hub, tmp_path,
                                                                 monkeypatch):
    monkeypatch.setenv("OSCAR_ZOO_MIRROR_TARGETS", f"smollm2-*={HF}")
    registry.publish_dir(make_bundle(tmp_path / "b").path)
    out = CliRunner().invoke(cli, ["mirror", "HuggingFaceTB/SmolLM2-135M-Instruct@1", "--json"])
    assert out.exit_code == 0, out.output
    assert [(r["target"], r["status"], r["tag"]) for r in json.loads(out.stdout)] == [
        ("hf", "done", TAG)]


def test_no_target_names_the_model_and_the_fix(registry, hub, tmp_path):
    registry.publish_dir(make_bundle(tmp_path / "b").path)
    out = CliRunner().invoke(cli, ["mirror", "HuggingFaceTB/SmolLM2-135M-Instruct@1"])
    assert out.exit_code != 0
    assert "no mirror target for smollm2-135m" in out.output and "--to" in out.output
    assert hub.repo("hf", REPO) is None
