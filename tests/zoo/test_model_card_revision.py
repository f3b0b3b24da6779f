"""A bundle's model card names the base model's revision the rotations were calibrated on (the
manifest's model.revision): rotations fit one set of weights, and a model repo's main branch
moves on. Where the manifest has none, the card says so instead of implying the current one."""

from __future__ import annotations

import pytest
import yaml

from oscar_zoo.zoo.model_card import render_card
from tests.utils.bundles import make_manifest

HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def card_with(revision):
    m = make_manifest(seed=1)
    m = m.model_copy(update={"model": m.model.model_copy(update={"revision": revision})})
    card = render_card(m)
    return yaml.safe_load(card.split("---")[1]), card


def test_a_pinned_revision_is_in_the_metadata_and_the_text():
    meta, card = card_with(COMMIT)
    assert meta["base_model"] == HUB_ID         # the Hub links a bare repo id only
    assert meta["oscar_zoo"]["base_model_revision"] == COMMIT
    assert (f"Calibrated on [{HUB_ID}](https://huggingface.co/{HUB_ID}/tree/{COMMIT}) at "
            f"revision `{COMMIT}`.") in card


def test_a_branch_name_is_named_and_said_not_to_pin_the_weights():
    meta, card = card_with("main")
    assert meta["oscar_zoo"]["base_model_revision"] == "main"
    assert "at revision `main` (a branch or tag name" in card and "may have changed since" in card


@pytest.mark.parametrize("revision", [None, ""])
def test_no_recorded_revision_is_said_not_guessed(revision):
    meta, card = card_with(revision)
    assert "base_model_revision" not in (meta.get("oscar_zoo") or {})
    assert f"Calibrated on [{HUB_ID}](https://huggingface.co/{HUB_ID}); which revision was not recorded" in card


def test_validation_metadata_sits_beside_the_revision():
    from oscar_zoo.zoo.manifest import Validation, VariantResult

    report = Validation(
        passed=True, criterion="extra loss <= Hadamard's + 0.05 nats", tolerance=0.05,
        dataset="builtin:pydoc", context_len=384, eval_windows=1, eval_tokens=384, sink_tokens=64,
        recent_tokens=256, group_size=64, scale_dtype="float32", bf16_nll=2.0, bits_int2_tier=3.0,
        bits_at_context=7.0, created_at="2025-01-01T00:00:00Z", code_version="test",
        variants=[VariantResult(name="bundle", delta_nll=0.1, kl=0.01, attn_rel_error=0.2)])
    m = make_manifest(seed=1)
    m = m.model_copy(update={"validation": report,
                             "model": m.model.model_copy(update={"revision": COMMIT})})
    meta = yaml.safe_load(render_card(m).split("---")[1])
    assert meta["oscar_zoo"] == {"base_model_revision": COMMIT, "validated": True,
                                 "delta_nll": 0.1, "context_len": 384}
