"""`oscar-zoo promote | yank | alias | unalias` against a real registry server (SQLite) on loopback."""

from __future__ import annotations

import json
import time

import pytest

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
    row = json.loads(r.stdout)
    assert (row["status"], row["action"], row["mirrors"]) == ("yanked", "yanked", [])
    assert "removed aliases: stable" in r.stderr         # a deploy pinned to it learns it now
    assert "mirrors" not in r.stderr                     # it was never mirrored
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


def test_yank_says_what_stays_on_the_mirrors_and_a_second_yank_is_a_no_op(registry, hub, tmp_path,
                                                                         monkeypatch):
    """A yanked version stayed on the hub mirrors it was mirrored to (its tag keeps its files)
    and `yank` said nothing of them. It names them now, with what the registry does there and
    what is left to the user; and yanking it again says "already yanked" rather than fail."""
    from oscar_zoo.registry_db.mirrors import mirror_version
    from tests.utils.bundles import make_bundle

    model, repo, tag = "smollm2-135m", "oscar-zoo/rotations", "smollm2-135m-v1"
    registry.publish_dir(make_bundle(tmp_path / "b").path)
    assert [r.status for r in mirror_version(registry.registry, model, 1, [f"hf:{repo}"])] == ["done"]
    monkeypatch.setenv("OSCAR_ZOO_TOKEN", registry.token("bundles:publish"))

    r = zoo("yank", f"{model}@1", "--reason", "bad clips", "--json")
    assert r.exit_code == 0, r.output
    row = json.loads(r.stdout)
    assert (row["version"], row["status"], row["action"]) == (1, "yanked", "yanked")
    assert [(m["target"], m["repo"], m["tag"]) for m in row["mirrors"]] == [("hf", repo, tag)]
    note = " ".join(r.stderr.split())
    assert f"{model} v1 stays on its mirrors (hf:{repo}) under its tag {tag}" in note
    assert f"`oscar-zoo mirror {model}@1 --status`" in note and "delete the tag there" in note
    # what it says the registry does: the hub's index marks it yanked, the tag stays
    deadline = time.monotonic() + 30
    while not _yanked_on_hub(hub, repo, model, 1):
        assert time.monotonic() < deadline, "the registry never recorded the yank on the hub"
        time.sleep(0.1)
    assert tag in hub.repo("hf", repo).tags

    r = zoo("yank", f"{model}@1", "--reason", "something else")
    assert r.exit_code == 0, r.output
    assert r.stdout.strip() == f"{model} v1 was already yanked: bad clips"
    assert "keeps the reason it was yanked with (bad clips)" in r.stderr
    assert "stays on its mirrors" not in r.stderr        # said when it was yanked
    r = zoo("yank", f"{model}@1", "--reason", "bad clips", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["action"] == "already yanked", r.output
    assert r.stderr == ""


def _yanked_on_hub(hub, repo: str, model: str, number: int) -> bool:
    index = hub.repo("hf", repo).files().get("oscar-zoo.json")
    entry = json.loads(index[0])["models"][model]["versions"][str(number)] if index else {}
    return bool(entry.get("yanked"))


def test_yank_and_promote_refuse_an_alias_naming_the_version_it_points_at(registry, glm_bundles,
                                                                         monkeypatch):
    """`yank NAME@latest` run twice yanked two versions: latest moved to v1 after the first.
    An alias is refused, with the command that names the version it points at now."""
    registry.publish_dir(glm_bundles[0].path)
    registry.publish_dir(glm_bundles[1].path)
    monkeypatch.setenv("OSCAR_ZOO_TOKEN", registry.token("bundles:publish"))
    r = zoo("yank", f"{MODEL}@latest", "--reason", "bad clips")
    assert r.exit_code == 1 and r.stdout == "", r.output
    said = " ".join(r.stderr.split())
    assert said.startswith(f"Error: name the version: {MODEL}@latest points at version 2 now"), said
    assert f"Run `oscar-zoo yank {MODEL}@2 --reason 'bad clips'`" in said
    r = zoo("promote", f"{MODEL}@latest")     # an alias never names a draft: no dead-end fix
    assert r.exit_code == 1 and "promote takes a draft's number, not an alias" in r.stderr
    assert f"{MODEL} has no draft to promote" in r.stderr, r.output
    with RegistryClient() as client:
        assert [v["status"] for v in client.versions(MODEL)] == ["published", "published"]
    r = zoo("yank", f"{MODEL}@nosuch", "--reason", "x")     # the registry's word on the alias
    assert r.exit_code == 1 and "nosuch" in r.stderr, r.output


@pytest.mark.parametrize("reason", ["", "   "])
def test_yank_refuses_an_empty_reason_before_any_request(monkeypatch, reason):
    """It sent it, and printed the API's "body.reason: String should have at least 1 character"."""
    monkeypatch.setenv("OSCAR_ZOO_ENDPOINT", "http://127.0.0.1:9")     # nothing listens there
    r = zoo("yank", f"{MODEL}@1", "--reason", reason)
    assert r.exit_code == 2, r.output
    assert "Invalid value for '--reason': it is empty: say why the version is withdrawn" in r.stderr
    assert "cannot reach" not in r.stderr and "body.reason" not in r.stderr


def test_unalias_of_a_version_says_unalias_takes_no_version(monkeypatch):
    monkeypatch.setenv("OSCAR_ZOO_ENDPOINT", "http://127.0.0.1:9")
    r = zoo("unalias", "smollm2-135m@3", "prod")
    assert r.exit_code == 1, r.output
    assert r.stderr == ("Error: unalias takes NAME ALIAS, without a version: `oscar-zoo unalias "
                        "smollm2-135m prod` removes prod from smollm2-135m, whichever version it "
                        "points at\n")


def test_an_invalid_model_name_and_its_suggestion_are_two_sentences(monkeypatch):
    """"...(e.g. Qwen/Qwen3-8B) Did you mean: smollm2-135m?" ran them together."""
    monkeypatch.setenv("OSCAR_ZOO_ENDPOINT", "http://127.0.0.1:9")
    with pytest.raises(Exception) as e:
        RegistryClient().model("smollm2-135m!")
    assert "(e.g. Qwen/Qwen3-8B). Did you mean: smollm2-135m?" in str(e.value)
