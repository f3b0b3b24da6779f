"""pull's notes carry their weight from where they are made: info (hidden by -q), a warning
(said even under -q), or a warning about the bundle served, which the launch recipe's header
carries too. Their words do not decide it: a yank reason, a model name or a cache path holding
"reached" or "yanked" once moved a note in or out of the recipe."""

from __future__ import annotations

import hashlib
import json

import pytest
from click.testing import CliRunner

from oscar_zoo.zoo.cache import Cache
from oscar_zoo.zoo.cli.main import cli
from oscar_zoo.zoo.pull import Note, _plan_notes, materialize
from oscar_zoo.zoo.registry_client import RegistryClient
from oscar_zoo.zoo.sources.base import Plan
from oscar_zoo.zoo.sources.download import RemoteFile
from tests.utils.bundles import make_bundle

SMOL = "smollm2-135m"


def _plan(status: str | None, notes: list[str]) -> Plan:
    return Plan(source="registry", model=SMOL, origin="test", kind="bundle", status=status,
                notes=notes)


@pytest.mark.parametrize("status, level", [("yanked", "bundle"), ("draft", "bundle"),
                                           ("published", "info"), (None, "info")])
def test_a_sources_notes_weigh_what_its_status_says(status, level):
    # the words would have said otherwise: "reached" kept a yank out of the recipe, and a
    # note on a published version that mentions a yank is no warning
    notes = _plan_notes(_plan(status, ["accuracy target not reached, so v2 was yanked"]))
    assert notes == [Note("accuracy target not reached, so v2 was yanked", level)]


def test_note_levels():
    assert (Note("x").warning, Note("x").in_recipe) == (False, False)
    assert (Note("x", "warning").warning, Note("x", "warning").in_recipe) == (True, False)
    assert (Note("x", "bundle").warning, Note("x", "bundle").in_recipe) == (True, True)
    with pytest.raises(ValueError):
        Note("x", "warn")


def test_a_yank_reason_in_any_words_is_a_warning_the_recipe_carries(registry, glm_bundles):
    for b in glm_bundles:
        registry.publish_dir(b.path)
    reason = "accuracy target not reached on GPQA"
    with RegistryClient(token=registry.token("bundles:publish")) as client:
        client.yank("glm-4.7-fp8", 2, reason)
    said = f"version 2 of glm-4.7-fp8 was yanked: {reason}"
    r = CliRunner().invoke(cli, ["pull", "glm-4.7-fp8@2", "-q"])
    assert r.exit_code == 0, r.output
    assert f"warning: {said}" in r.stderr.splitlines()
    assert f"# WARNING: {said}" in r.stdout.splitlines()     # serve.sh keeps it
    data = json.loads(CliRunner().invoke(cli, ["pull", "glm-4.7-fp8@2", "--json"]).stdout)
    assert data["notes"] == data["warnings"] == [said]


def _cache_a_bundle(tmp_path) -> str:
    """smollm2-135m v1 in the cache as a registry pull leaves it (refs v1, latest)."""
    cache = Cache()
    cache.ensure()
    bundle = make_bundle(tmp_path / "b").path
    for f in bundle.iterdir():
        cache.add_bytes(f.read_bytes(), hashlib.sha256(f.read_bytes()).hexdigest())
    raw = (bundle / "bundle.json").read_bytes()
    plan = Plan(source="registry", model=SMOL, origin=f"test:{SMOL}@1", kind="bundle",
                digest=hashlib.sha256(raw).hexdigest(), version=1, refs=["v1", "latest"],
                manifest=raw, locate=lambda n, s, z: RemoteFile(n, url="http://127.0.0.1:9/x",
                                                                sha256=s, size=z))
    return materialize(plan, cache, progress=False).digest


def test_a_cache_path_holding_warning_words_stays_information(tmp_path, monkeypatch):
    root = tmp_path / "yanked-not-reached-is-a-draft-served-instead"
    monkeypatch.setenv("OSCAR_ZOO_CACHE", str(root))
    digest = _cache_a_bundle(tmp_path)
    monkeypatch.setenv("OSCAR_ZOO_OFFLINE", "1")
    r = CliRunner().invoke(cli, ["pull", f"{SMOL}@1", "-q"])
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith(f"# SGLang launch recipe for {SMOL} v1 (sha256:{digest[:12]})")
    assert "WARNING" not in r.stdout and "served from the cache" not in r.stderr
    told = CliRunner().invoke(cli, ["pull", f"{SMOL}@1"])
    assert f"note: served from the cache ({root})" in told.stderr.splitlines()
    data = json.loads(CliRunner().invoke(cli, ["pull", f"{SMOL}@1", "--json"]).stdout)
    assert data["notes"] == [f"served from the cache ({root})"] and data["warnings"] == []
