"""The manifest pins the weights a bundle was calibrated on: the commit a hub model's revision
resolved to when it loaded, not the revision as asked (usually none, or a branch that moves)."""

from __future__ import annotations

import pytest

from oscar_zoo.calibrate import loading

COMMIT = "0123456789abcdef0123456789abcdef01234567"
REPO = "oscar-zoo-test/tiny-llama"


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """REPO in an offline Hugging Face cache, `main` at COMMIT: a tiny random Llama (2 layers,
    2 query heads and 1 KV head of 64) with a word-level tokenizer, as a download leaves it."""
    import huggingface_hub.constants as hf
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    cache = tmp_path / "hub"
    repo = cache / f"models--{REPO.replace('/', '--')}"
    snapshot = repo / "snapshots" / COMMIT
    words = ["[UNK]", *"abcdefghijklmnopqrstuvwxyz", "the", "of", "and", "to", "a", "in", "is"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(snapshot)
    config = LlamaConfig(vocab_size=64, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                         architectures=["LlamaForCausalLM"])
    LlamaForCausalLM(config).save_pretrained(snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    monkeypatch.setattr(hf, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hf, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return snapshot


def test_a_hub_model_is_calibrated_and_recorded_at_its_resolved_commit(hub_cache):
    """The manifest said revision None (cfg.revision as asked): model cards could not pin the
    weights the rotations were fitted to."""
    from oscar_zoo.calibrate.pipeline import CalibrationConfig, calibrate

    model, tok = loading.load_model(loading.resolve_source(REPO))
    assert loading.loaded_revision(model.config, None) == COMMIT
    cfg = CalibrationConfig(model=REPO, tokens=256, seq_len=256, clip_search=False)
    manifest = calibrate(cfg, loaded=(model, tok)).bundle.manifest
    assert manifest.model.revision == COMMIT and manifest.model.hub_id == REPO
    assert manifest.calibration.spec["revision"] is None       # the spec keeps what was asked


def test_a_branch_asked_for_is_recorded_as_its_commit(hub_cache):
    model, _ = loading.load_model(loading.resolve_source(REPO, "main"))
    assert loading.loaded_revision(model.config, "main") == COMMIT


def test_a_local_directory_keeps_the_revision_asked_for(hub_cache, tmp_path):
    local = tmp_path / "copy"
    local.mkdir()
    for f in hub_cache.iterdir():
        (local / f.name).write_bytes(f.read_bytes())
    model, _ = loading.load_model(loading.resolve_source(str(local)))
    assert loading.loaded_revision(model.config, None) is None
    assert loading.loaded_revision(model.config, "v1.0") == "v1.0"


@pytest.mark.parametrize("commit, requested, recorded", [
    (COMMIT, None, COMMIT), (COMMIT, "main", COMMIT), (None, "v1.0", "v1.0"), (None, None, None),
])
def test_the_revision_recorded_is_the_configs_commit_else_the_one_asked(commit, requested,
                                                                       recorded):
    """transformers 4 put the commit on every hub model's config (`_commit_hash`); load_model
    puts it there under transformers 5, which resolves the revision and drops it."""
    from transformers import LlamaConfig

    config = LlamaConfig()
    if commit is not None:
        config._commit_hash = commit
    assert loading.loaded_revision(config, requested) == recorded


def test_the_runner_stamps_the_revision_the_calibration_recorded():
    from oscar_zoo.calibrate import jobspec, runner
    from tests.utils.bundles import make_manifest

    manifest = make_manifest("smollm2-135m")
    manifest = manifest.model_copy(update={"model": manifest.model.model_copy(
        update={"revision": COMMIT})})
    job = {"id": "j1", "spec": {"model": "smollm2-135m", "revision": "main"}}
    stamped = runner.stamp(manifest, job, jobspec.parse_spec(job["spec"]))
    assert stamped.model.revision == COMMIT
    assert stamped.calibration.spec == {"model": "smollm2-135m", "revision": "main"}
    unresolved = manifest.model_copy(update={"model": manifest.model.model_copy(
        update={"revision": None})})
    assert runner.stamp(unresolved, job, jobspec.parse_spec(job["spec"])).model.revision == "main"
