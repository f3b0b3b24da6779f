"""A cached copy of a yanked (or draft) version carries the warning an online pull gives: on
stderr, in the launch recipe's header and in --json, whether the cache answers offline, because
the registry cannot be reached, or for `export`. The cache learns a yank from any answer of the
registry that shows it, a refusal ("no published version") included, not only from a pull of
that very version."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from oscar_zoo.zoo.cache import Cache
from oscar_zoo.zoo.cli.main import cli
from oscar_zoo.zoo.pull import pull
from oscar_zoo.zoo.registry_client import RegistryClient
from tests.utils.bundles import make_bundle

SMOL = "smollm2-135m"
REASON = "clip search overfit the calibration text"
SAID = f"version 1 of {SMOL} was yanked: {REASON}"


def _v1_pulled_then_yanked(registry, tmp_path) -> str:
    """smollm2-135m v1 pulled (refs v1, latest), then yanked in the registry; returns its digest."""
    registry.publish_dir(make_bundle(tmp_path / "b").path)
    digest = pull(SMOL).digest
    with RegistryClient(token=registry.token("bundles:publish")) as client:
        client.yank(SMOL, 1, REASON)
    return digest


def _told(result, stdout_header: bool = True) -> None:
    assert result.exit_code == 0, result.output
    assert f"warning: {SAID}" in result.stderr.splitlines(), result.stderr
    if stdout_header:     # `pull ... > serve.sh` keeps it
        assert f"# WARNING: {SAID}" in result.stdout.splitlines(), result.stdout


def test_the_refusal_of_a_yanked_models_default_records_the_yank(registry, tmp_path, monkeypatch):
    """The walkthrough: pull v1, yank it; the online pull is refused (no published version),
    and the offline one served v1 through the `latest` ref it had recorded, with no word."""
    digest = _v1_pulled_then_yanked(registry, tmp_path)
    refused = CliRunner().invoke(cli, ["pull", SMOL])
    assert refused.exit_code == 1 and "has no published version" in refused.stderr, refused.output
    meta = Cache().read_meta(SMOL, digest)
    assert (meta["status"], meta["yank_reason"]) == ("yanked", REASON)
    monkeypatch.setenv("OSCAR_ZOO_OFFLINE", "1")
    _told(CliRunner().invoke(cli, ["pull", SMOL, "-q"]))    # -q hides no warning
    data = json.loads(CliRunner().invoke(cli, ["pull", SMOL, "--json"]).stdout)
    assert data["status"] == "yanked" and SAID in data["warnings"]


@pytest.mark.parametrize("how", ["offline", "registry down"])
def test_a_version_pulled_after_its_yank_warns_from_the_cache(registry, tmp_path, monkeypatch, how):
    """An online pull of v1 after the yank recorded "status": "yanked" in the meta, which the
    cache's answer then did not read."""
    _v1_pulled_then_yanked(registry, tmp_path)
    _told(CliRunner().invoke(cli, ["pull", f"{SMOL}@1"]))          # online: the registry says so
    if how == "offline":
        monkeypatch.setenv("OSCAR_ZOO_OFFLINE", "1")
    else:
        monkeypatch.setenv("OSCAR_ZOO_ENDPOINT", "http://127.0.0.1:1")     # nothing listens
    for spec in (SMOL, f"{SMOL}@1"):
        result = CliRunner().invoke(cli, ["pull", spec])
        _told(result)
        if how == "registry down":     # and why the cache answered, as before
            assert "using the cached copy" in result.stderr


def test_export_of_a_yanked_cached_version_warns(registry, tmp_path):
    _v1_pulled_then_yanked(registry, tmp_path)
    CliRunner().invoke(cli, ["pull", SMOL])      # refused, and the yank recorded
    out = tmp_path / "out"
    _told(CliRunner().invoke(cli, ["export", f"{SMOL}@1", "--out", str(out)]))
    data = json.loads(CliRunner().invoke(cli, ["export", f"{SMOL}@1", "--out", str(out),
                                               "--json"]).stdout)
    assert data["warnings"] == [SAID]
    # the bundle's own files: no recipe to carry it, stderr still does
    _told(CliRunner().invoke(cli, ["export", f"{SMOL}@1", "--format", "safetensors",
                                   "--out", str(tmp_path / "st")]), stdout_header=False)


def test_a_yank_seen_while_pulling_another_version_is_recorded(registry, tmp_path, monkeypatch):
    """v1 cached, then yanked; v2 published and pulled: the registry's answer for v2 lists v1 as
    yanked, and `pull NAME@1` offline says so."""
    digest = _v1_pulled_then_yanked(registry, tmp_path)
    registry.publish_dir(make_bundle(tmp_path / "b2", seed=1).path)
    assert pull(SMOL).version == 2
    assert Cache().read_meta(SMOL, digest)["status"] == "yanked"
    monkeypatch.setenv("OSCAR_ZOO_OFFLINE", "1")
    _told(CliRunner().invoke(cli, ["pull", f"{SMOL}@1"]))
    quiet = CliRunner().invoke(cli, ["pull", SMOL])         # v2 is fine: no warning
    assert quiet.exit_code == 0 and "WARNING" not in quiet.stdout and "warning" not in quiet.stderr


def test_a_cached_draft_warns_offline(registry, tmp_path, monkeypatch):
    registry.publish_dir(make_bundle(tmp_path / "b").path, status="draft")
    said = f"version 1 of {SMOL} is a draft, not published"
    assert any(n.text == said and n.in_recipe for n in pull(f"{SMOL}@1").notes)
    monkeypatch.setenv("OSCAR_ZOO_OFFLINE", "1")
    notes = pull(f"{SMOL}@1").notes
    assert [n.level for n in notes if n.text == said] == ["bundle"], notes
