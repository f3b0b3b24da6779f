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


def test_mirror_from_a_client_refuses_instead_of_making_an_empty_registry(tmp_path, monkeypatch):
    """With OSCAR_ZOO_ENDPOINT set (the README's client setup) mirror opened a local database
    anyway: it made an empty registry.sqlite in the data dir and said the version did not
    exist."""
    data = tmp_path / "client-data"
    monkeypatch.setenv("OSCAR_ZOO_DATA_DIR", str(data))
    monkeypatch.delenv("OSCAR_ZOO_DATABASE_URL", raising=False)
    monkeypatch.setenv("OSCAR_ZOO_ENDPOINT", "http://127.0.0.1:9")
    out = CliRunner().invoke(cli, ["mirror", "smollm2-135m@1", "--to", "hf:org/rotations"])
    assert out.exit_code == 1 and "registry's host" in out.output and "--status" in out.output
    monkeypatch.delenv("OSCAR_ZOO_ENDPOINT")
    out = CliRunner().invoke(cli, ["mirror", "smollm2-135m@1", "--to", "hf:org/rotations"])
    assert out.exit_code == 1 and "no registry on this host" in out.output
    assert not (data / "registry.sqlite").exists()


def _bundle(out, seed: int, **model):
    """A bundle whose manifest's model fields are replaced by `model` (same calibration tag)."""
    from oscar_zoo.zoo.bundle import Bundle, write
    from tests.utils.bundles import make_manifest, make_tensors

    m = make_manifest(seed=seed)
    m = m.model_copy(update={"model": m.model.model_copy(update=model),
                             "calibration": m.calibration.model_copy(update={"tokens": 1000})})
    return write(Bundle(m, *make_tensors(m, seed)), out)


def test_a_bundle_naming_its_model_by_an_alias_joins_the_models_versions(registry, hub,
                                                                        tmp_path, monkeypatch):
    from oscar_zoo.registry_db.mirrors import mirror_version
    from oscar_zoo.zoo.pull import pull
    from tests.zoo.test_mirror import FOLDER

    b1 = _bundle(tmp_path / "b1", 0, name="smollm2-135m")
    b2 = _bundle(tmp_path / "b2", 1, name="SmolLM2-135M-Instruct")  # an alias of the model
    registry.publish_dir(b1.path)
    assert registry.publish_dir(b2.path).version.number == 2
    r2 = mirror_version(registry.registry, "smollm2-135m", 2, [HF])[0]
    r1 = mirror_version(registry.registry, "smollm2-135m", 1, [HF])[0]
    assert (r2.tag, r2.path) == ("smollm2-135m-v2", FOLDER)
    assert (r1.tag, r1.path) == (TAG, f"{FOLDER}/v1")  # v2 keeps the folder on main
    repo = hub.repo("hf", REPO)
    assert set(repo.tags) == {TAG, "smollm2-135m-v2"}
    assert hashlib.sha256(repo.files()[f"{FOLDER}/bundle.json"][0]).hexdigest() == b2.digest
    index = json.loads(repo.files()["oscar-zoo.json"][0])
    assert list(index["models"]) == ["smollm2-135m"]
    assert sorted(index["models"]["smollm2-135m"]["versions"]) == ["1", "2"]
    monkeypatch.setenv("OSCAR_ZOO_HF_MIRROR_REPO", REPO)
    monkeypatch.setenv("OSCAR_ZOO_SOURCES", "hf")
    assert pull("smollm2-135m@1").digest == b1.digest


def test_two_models_with_one_repo_name_get_their_own_folders(registry, hub, tmp_path):
    """HuggingFaceTB/SmolLM2-135M-Instruct and a fine-tune unsloth/SmolLM2-135M-Instruct: the
    second must not overwrite the first's folder on main."""
    from oscar_zoo.registry_db.mirrors import mirror_version
    from tests.zoo.test_mirror import FOLDER

    a = _bundle(tmp_path / "a", 0)
    b = _bundle(tmp_path / "b", 5, name="smol-finetune", hub_id="unsloth/SmolLM2-135M-Instruct")
    registry.publish_dir(a.path)
    registry.publish_dir(b.path)
    ra = mirror_version(registry.registry, "smollm2-135m", 1, [HF])[0]
    rb = mirror_version(registry.registry, "smol-finetune", 1, [HF])[0]
    assert ra.path == FOLDER
    assert (rb.status, rb.path) == ("done", "unsloth--SmolLM2-135M-Instruct/seq1000_prompt0_group64")
    files = hub.repo("hf", REPO).files()
    assert hashlib.sha256(files[f"{ra.path}/bundle.json"][0]).hexdigest() == a.digest
    assert hashlib.sha256(files[f"{rb.path}/bundle.json"][0]).hexdigest() == b.digest
    # the next version of each stays in its own folder
    a2 = _bundle(tmp_path / "a2", 7)
    registry.publish_dir(a2.path)
    assert mirror_version(registry.registry, "smollm2-135m", 2, [HF])[0].path == FOLDER
