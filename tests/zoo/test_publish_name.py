"""`oscar-zoo publish BUNDLE --name OTHER`, OTHER not the bundle's model: the registry's refusal
ended in its API's fix ("upload it to /v1/models/smollm2-135m/versions"), a REST path, where
the command's fix is to drop --name or name the bundle's model. The command tells that refusal
by the model its answer names (`bundle_model`), never by its words."""

from __future__ import annotations

import httpx
import pytest
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
    assert said.endswith("; drop --name (publish takes the model from bundle.json), "
                         "or pass --name smollm2-135m"), said
    assert "/v1/models" not in said
    r = CliRunner().invoke(cli, ["publish", str(bundle), "--name", "smollm2-135m"])
    assert r.exit_code == 0 and "published smollm2-135m v1" in r.stdout, r.output


OLD_WORDS = ("this bundle is for smollm2-135m (HuggingFaceTB/SmolLM2-135M), not 'brand-new-model'; "
             "upload it to /v1/models/smollm2-135m/versions")
NEW_WORDS = ("this bundle is for smollm2-135m (HuggingFaceTB/SmolLM2-135M), not 'brand-new-model'; "
             "POST it to /v1/models/smollm2-135m/versions instead")


@pytest.mark.parametrize("detail,member,fixed", [
    (NEW_WORDS, {"bundle_model": "smollm2-135m"}, True),   # reworded: the member still tells it
    (OLD_WORDS, {}, False),         # a registry from before the member: its own words, whole
])
def test_the_fix_comes_from_the_registrys_bundle_model(tmp_path, monkeypatch, detail, member,
                                                       fixed):
    from oscar_zoo.zoo.sources import download

    def answer(request):
        return httpx.Response(422, json={"type": "about:blank", "title": "Invalid input",
                                         "status": 422, "detail": detail, **member})

    monkeypatch.setattr(download, "new_client", lambda **kw: httpx.Client(
        transport=httpx.MockTransport(answer), **kw))
    monkeypatch.setenv("OSCAR_ZOO_ENDPOINT", "http://registry.test")
    monkeypatch.setenv("OSCAR_ZOO_TOKEN", "ozk_" + "P" * 43)
    bundle = make_bundle(tmp_path / "smol").path
    r = CliRunner().invoke(cli, ["publish", str(bundle), "--name", "brand-new-model"])
    assert r.exit_code == 1, r.output
    said = " ".join(r.stderr.split())
    if fixed:
        assert said.endswith("not 'brand-new-model'; drop --name (publish takes the model from "
                             "bundle.json), or pass --name smollm2-135m"), said
        assert "/v1/models" not in said
    else:
        assert said.endswith(f"registry http://registry.test: {OLD_WORDS}"), said
