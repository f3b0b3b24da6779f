"""`oscar-zoo promote | yank | alias | unalias` against a real registry server (SQLite) on loopback."""

from __future__ import annotations

import json

from click.testing import CliRunner

from oscar_zoo.zoo.cli.main import cli
from oscar_zoo.zoo.pull import pull
from oscar_zoo.zoo.registry_client import RegistryClient

MODEL = "glm-4.7-fp8"


def zoo(*args):
    return CliRunner().invoke(cli, list(args))


def test_promote_alias_and_yank_drive_what_pull_gets(registry, glm_bundles, monkeypatch):
    registry.publish_dir(glm_bundles[0].path)
    registry.publish_dir(glm_bundles[1].path, status="draft")
    monkeypatch.setenv("OSCAR_ZOO_TOKEN", registry.token("bundles:publish"))
    assert pull(MODEL).version == 1  # a draft is not latest

    r = zoo("promote", f"{MODEL}@2")
    assert r.exit_code == 0, r.output
    assert r.stdout.strip() == f"{MODEL} v2 is published [latest]"
    assert pull(MODEL).version == 2

    r = zoo("alias", f"{MODEL}@1", "recommended", "--reason", "lower loss on GPQA")
    assert r.exit_code == 0 and r.stdout.strip() == f"{MODEL}@recommended -> v1", r.output
    assert pull(MODEL).version == 1  # recommended wins over latest
    r = zoo("alias", f"{MODEL}@latest", "stable", "--json")
    assert r.exit_code == 0, r.output
    assert {a["alias"]: a["version"] for a in json.loads(r.stdout)["items"]}["stable"] == 2

    r = zoo("yank", f"{MODEL}@2", "--reason", "clip search bug", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["status"] == "yanked"
    assert "removed aliases: stable" in r.stderr         # a deploy pinned to it learns it now
    r = zoo("pull", f"{MODEL}@stable")                   # and later, why it is gone
    assert r.exit_code == 1 and "alias 'stable' was removed" in r.stderr
    assert "version 2 yanked: clip search bug" in r.stderr
    r = zoo("pull", f"{MODEL}@2", "-q")                  # `> serve.sh` keeps the warning; -q too
    assert r.exit_code == 0, r.output
    assert f"# WARNING: version 2 of {MODEL} was yanked" in r.stdout and "yanked" in r.stderr
    with RegistryClient() as client:
        history = client.aliases(MODEL)["history"]
        assert client.version(MODEL, "latest")["version"] == 1
        assert "stable" not in client.model(MODEL)["version_aliases"]  # it was on v2
    assert any(e.get("reason") == "lower loss on GPQA" for e in history)

    r = zoo("unalias", MODEL, "recommended", "--reason", "back to latest")
    assert r.exit_code == 0 and r.stdout.strip() == f"{MODEL}@recommended removed", r.output
    assert pull(MODEL).version == 1  # latest again (v2 is yanked)
    r = zoo("unalias", MODEL, "recommended")
    assert r.exit_code == 1 and "has no alias 'recommended' to remove; its aliases: latest\n" in r.stderr, r.output


def test_bad_calls_say_how_to_fix_them_and_change_nothing(registry, glm_bundles, monkeypatch):
    registry.publish_dir(glm_bundles[0].path, status="draft")
    r = zoo("promote", MODEL)
    assert r.exit_code == 1 and f"say which version: {MODEL}@VERSION" in r.stderr
    r = zoo("promote", f"{MODEL}@1")  # no token
    assert r.exit_code == 1 and "login" in r.stderr.lower(), r.output
    assert zoo("yank", f"{MODEL}@1").exit_code == 2  # --reason is required
    monkeypatch.setenv("OSCAR_ZOO_TOKEN", registry.token("jobs:submit"))
    r = zoo("alias", f"{MODEL}@1", "recommended")
    assert r.exit_code == 1 and "bundles:publish" in r.stderr, r.output
    monkeypatch.setenv("OSCAR_ZOO_TOKEN", registry.token("bundles:publish"))
    r = zoo("yank", f"{MODEL}@7", "--reason", "typo")
    assert r.exit_code == 1 and f"{MODEL} has no version 7; its versions: 1;" in r.stderr, r.output
    r = zoo("alias", f"{MODEL}@1", "recommended")
    assert r.exit_code == 1 and "published versions only" in r.stderr, r.output
    with RegistryClient() as client:
        assert client.version(MODEL, 1)["status"] == "draft" and not client.aliases(MODEL)["items"]
