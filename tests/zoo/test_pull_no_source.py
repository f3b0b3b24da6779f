"""`pull --source registry` with OSCAR_ZOO_ENDPOINT unset: it blamed OSCAR_ZOO_SOURCES, which
the user had not set, and never said the bundle was cached. It names where the list came from,
what the registry needs, and, when the bundle asked for is cached, how to use that copy.

The cached copy is not served by itself: the cache stands in for sources that could not answer
(an outage: README "falls back to a cached copy when none can be reached"), not for a source
that was never configured. That is a setting to fix, as a refused token is, and serving the
cache instead would hide it on every pull, with the bundle never updated."""

from __future__ import annotations

from click.testing import CliRunner

from oscar_zoo.zoo.cli.main import cli
from tests.utils.bundles import make_bundle

SMOL = "smollm2-135m"


def told(*args) -> str:
    r = CliRunner().invoke(cli, list(args))
    assert r.exit_code == 1 and r.stdout == "", r.output
    return " ".join(r.stderr.split())


def _cached_smol(registry, tmp_path, monkeypatch):
    registry.publish_dir(make_bundle(tmp_path / "smol").path)
    r = CliRunner().invoke(cli, ["pull", SMOL, "-q"])
    assert r.exit_code == 0, r.output
    monkeypatch.delenv("OSCAR_ZOO_ENDPOINT")


def test_source_flag_without_an_endpoint_names_the_flag_and_the_cached_copy(registry, tmp_path,
                                                                            monkeypatch):
    _cached_smol(registry, tmp_path, monkeypatch)
    monkeypatch.delenv("OSCAR_ZOO_SOURCES")     # the default list: registry,hf,modelscope
    line = told("pull", SMOL, "--source", "registry")
    assert line.startswith("Error: no source to pull from: --source registry names only the "
                           "registry, which needs OSCAR_ZOO_ENDPOINT (not set)"), line
    assert "OSCAR_ZOO_SOURCES lists" not in line
    assert "set OSCAR_ZOO_ENDPOINT to the registry's URL (e.g. http://127.0.0.1:8000)" in line
    assert "drop --source to pull from OSCAR_ZOO_SOURCES (registry,hf,modelscope)" in line
    assert f"{SMOL} is in the cache (v1, sha256:" in line
    assert "OSCAR_ZOO_OFFLINE=1 serves that copy" in line
    # and a version that is not cached is not said to be
    line = told("pull", f"{SMOL}@2", "--source", "registry")
    assert "in the cache" not in line and "OSCAR_ZOO_OFFLINE" not in line


def test_sources_setting_without_an_endpoint_names_the_setting(registry, tmp_path, monkeypatch):
    _cached_smol(registry, tmp_path, monkeypatch)
    monkeypatch.setenv("OSCAR_ZOO_SOURCES", "registry")
    line = told("pull", SMOL)
    assert line.startswith("Error: no source to pull from: OSCAR_ZOO_SOURCES (registry) names "
                           "only the registry, which needs OSCAR_ZOO_ENDPOINT (not set)"), line
    assert "add hf or modelscope to OSCAR_ZOO_SOURCES" in line
    assert "OSCAR_ZOO_OFFLINE=1 serves that copy" in line
    assert "drop --source" not in line
