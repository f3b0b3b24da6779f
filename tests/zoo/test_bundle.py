"""The canonical bundle: round trip, verification of every property, atomic writes."""

from __future__ import annotations

import json

import numpy as np
import pytest

from oscar_zoo.zoo import bundle as B
from oscar_zoo.zoo.errors import BundleFormatError, IntegrityError
from oscar_zoo.zoo.manifest import CARD, MANIFEST, TENSORS
from tests.utils.bundles import make_manifest, make_tensors, random_orthogonal


def random_bundle(model="smollm2-135m", per_head=False, centered=True, seed=0) -> B.Bundle:
    """An in-memory valid bundle (not written), from the shared test helper."""
    manifest = make_manifest(model, per_head, seed, centered)
    return B.Bundle(manifest, *make_tensors(manifest, seed))


@pytest.mark.parametrize("per_head", [False, True])
@pytest.mark.parametrize("centered", [False, True])
def test_round_trip(tmp_path, per_head, centered):
    original = random_bundle(per_head=per_head, centered=centered)
    B.write(original, tmp_path / "b")
    back = B.read(tmp_path / "b")
    assert back.layers == original.layers
    for side in ("k", "v"):
        for layer in original.layers:
            a, b = original.side(side)[layer], back.side(side)[layer]
            np.testing.assert_array_equal(a.rotation, b.rotation)
            np.testing.assert_array_equal(a.clip, b.clip)
            np.testing.assert_array_equal(a.eigenvalues, b.eigenvalues)
            assert (a.mean is None) == (b.mean is None)
            if a.mean is not None:
                np.testing.assert_array_equal(a.mean, b.mean)
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == [CARD, MANIFEST, TENSORS]


def test_hybrid_model_uses_global_layer_ids(tmp_path):
    b = B.write(random_bundle("qwen3.5-35b-a3b", centered=False), tmp_path / "b")
    assert b.layers == list(range(3, 40, 4))
    names = set(B._load_tensors(tmp_path / "b" / TENSORS))
    assert "k.3.rotation" in names and "k.0.rotation" not in names


def test_digest_is_stable_and_content_addressed(tmp_path):
    one = B.write(random_bundle(seed=1), tmp_path / "a")
    two = B.write(random_bundle(seed=1), tmp_path / "b")
    three = B.write(random_bundle(seed=2), tmp_path / "c")
    assert one.digest == two.digest          # same content (the helper pins created_at)
    assert one.manifest.files == two.manifest.files
    assert one.digest != three.digest
    assert B.Bundle(B.read_manifest(tmp_path / "a")).digest == one.digest   # stable through disk


def test_manifest_rejects_unknown_fields(tmp_path):
    B.write(random_bundle(), tmp_path / "b")
    data = json.loads((tmp_path / "b" / MANIFEST).read_text())
    data["method"]["kompositon"] = "typo"
    (tmp_path / "b" / MANIFEST).write_text(json.dumps(data))
    with pytest.raises(BundleFormatError, match="kompositon"):
        B.verify_bundle(tmp_path / "b")


@pytest.mark.parametrize("by_layer", [{"first": 64}, {"0": 0}])
def test_manifest_rejects_per_layer_geometry_that_is_not_by_layer_id(tmp_path, by_layer):
    B.write(random_bundle(), tmp_path / "b")
    data = json.loads((tmp_path / "b" / MANIFEST).read_text())
    data["geometry"]["head_dim_by_layer"] = by_layer
    (tmp_path / "b" / MANIFEST).write_text(json.dumps(data))
    with pytest.raises(BundleFormatError, match="geometry.head_dim_by_layer"):
        B.verify_bundle(tmp_path / "b")


def test_tampered_tensor_file_fails_hash_check(tmp_path):
    B.write(random_bundle(), tmp_path / "b")
    path = tmp_path / "b" / TENSORS
    raw = bytearray(path.read_bytes())
    raw[-5] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(IntegrityError, match="sha256"):
        B.verify_bundle(tmp_path / "b")


def test_unlisted_file_is_rejected(tmp_path):
    B.write(random_bundle(), tmp_path / "b")
    (tmp_path / "b" / "notes.txt").write_text("hi")
    with pytest.raises(BundleFormatError, match="unlisted"):
        B.verify_bundle(tmp_path / "b")


def _broken(mutate):
    b = random_bundle(centered=True)
    mutate(b)
    return b


@pytest.mark.parametrize("mutate, message", [
    (lambda b: setattr(b.k[0], "rotation", b.k[0].rotation * 1.01), "not orthogonal"),
    (lambda b: b.v[3].rotation.__setitem__((0, 0), np.nan), "NaN"),
    (lambda b: setattr(b.k[1], "clip", np.full(3, 1.5, np.float32)), r"\[0, 1\]"),
    (lambda b: setattr(b.k[2], "rotation", np.eye(32, dtype=np.float32)), "shape"),
    (lambda b: setattr(b.k[2], "mean", None), "missing tensors"),
    (lambda b: b.k.pop(29), "missing tensors"),
    (lambda b: b.v.__setitem__(30, b.v[0]), "unexpected tensor"),
])
def test_invalid_bundles_are_refused_and_nothing_is_written(tmp_path, mutate, message):
    with pytest.raises(BundleFormatError, match=message):
        B.write(_broken(mutate), tmp_path / "out")
    assert list(tmp_path.iterdir()) == []   # no bundle, no staging leftovers


def test_write_refuses_to_clobber_and_overwrite_is_atomic(tmp_path):
    B.write(random_bundle(seed=1), tmp_path / "b")
    with pytest.raises(FileExistsError):
        B.write(random_bundle(seed=2), tmp_path / "b")
    B.write(random_bundle(seed=2), tmp_path / "b", overwrite=True)
    np.testing.assert_array_equal(B.read(tmp_path / "b").k[0].rotation, random_bundle(seed=2).k[0].rotation)
    assert [p.name for p in tmp_path.iterdir()] == ["b"]


def test_every_file_is_fsynced_before_the_bundle_is_renamed_into_place(tmp_path, monkeypatch):
    """A power loss after the rename must not leave a bundle of empty files. The crash cannot
    run here, so os.fsync is wrapped to record which inodes reached the disk."""
    import os

    synced, real_fsync = set(), os.fsync

    def fsync(fd):
        synced.add(os.fstat(fd).st_ino)
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    B.write(random_bundle(), tmp_path / "b")
    for name in (MANIFEST, TENSORS, CARD):
        assert (tmp_path / "b" / name).stat().st_ino in synced, name


def test_orthogonality_error_float64_reference():
    rng = np.random.default_rng(3)
    r = random_orthogonal(rng, 4, 16, 16).astype(np.float64)
    r[2] += 1e-3 * rng.standard_normal((16, 16))
    ref = max(np.abs(m @ m.T - np.eye(16)).max() for m in r)
    assert B.orthogonality_error(r) == pytest.approx(ref, rel=1e-12)
    assert B.orthogonality_error(r[0]) < 1e-6


def test_model_card_has_front_matter_and_recipe(tmp_path):
    B.write(random_bundle(), tmp_path / "b")
    card = (tmp_path / "b" / CARD).read_text()
    import yaml

    head = card.split("---")[1]
    meta = yaml.safe_load(head)
    assert meta["base_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert meta["library_name"] == "oscar-zoo"
    assert "--kv-cache-dtype int2" in card and "SGLANG_OSCAR_K_CLIP_RATIO=0.96" in card
    # the files `pull --format sglang` writes, not k_rotation.pt (OSCAR's loader then fails)
    assert "SGLANG_OSCAR_K_ROTATION_PATH='<dir>/k_rotation_qqt_r_h_pbr.pt'" in card
    assert "SGLANG_OSCAR_V_ROTATION_PATH='<dir>/v_rotation_sst_r_h_pbr.pt'" in card
    assert "Lloyd-Max" not in card


def test_a_lloyd_max_bundles_card_says_so_in_its_cache_row(tmp_path):
    bundle = random_bundle()
    q = bundle.manifest.quantization.model_copy(update={"lloyd_max": True})
    bundle.manifest = bundle.manifest.model_copy(update={"quantization": q})
    B.write(bundle, tmp_path / "b")
    card = (tmp_path / "b" / CARD).read_text()
    cache_row = next(line for line in card.splitlines() if line.startswith("| INT2 cache |"))
    assert "Lloyd-Max buckets (SGLANG_LLOYD_MAX=1)" in cache_row and "SGLANG_LLOYD_MAX=1" in card
    # groups below head_dim: SGLang's grouped kernel ignores the variable, and the card says so
    q = q.model_copy(update={"group_size": bundle.manifest.geometry.head_dim // 2})
    bundle.manifest = bundle.manifest.model_copy(update={"quantization": q})
    B.write(bundle, tmp_path / "c")
    card = (tmp_path / "c" / CARD).read_text()
    cache_row = next(line for line in card.splitlines() if line.startswith("| INT2 cache |"))
    assert "Lloyd-Max" not in cache_row and "export SGLANG_LLOYD_MAX" not in card
    assert "served uniform INT2 whatever the variable says" in card


def test_a_layers_output_is_verified_against_its_partial_json(tmp_path):
    """`pull --layers ... --format safetensors --out D` wrote partial.json beside the chosen
    layers' tensors, but inspect, verify and export checked D against the whole manifest and
    called oscar-zoo's own output corrupt."""
    from click.testing import CliRunner

    from oscar_zoo.zoo.cli.main import cli
    from tests.utils.bundles import make_bundle

    bundle = make_bundle(tmp_path / "b")
    out = tmp_path / "part"
    run = CliRunner().invoke
    r = run(cli, ["export", str(bundle.path), "--format", "safetensors", "--layers", "0,2,4",
                  "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert run(cli, ["inspect", str(out)]).exit_code == 0
    r = run(cli, ["export", str(out), "--format", "sglang", "--out", str(tmp_path / "sg")])
    assert r.exit_code == 0, r.output
    torch = pytest.importorskip("torch")
    k = torch.load(next((tmp_path / "sg").glob("k_rotation*.pt")), weights_only=True)
    assert sorted(k["layers"]) == [0, 2, 4]
    tensors = out / "rotations.safetensors"
    tensors.write_bytes(tensors.read_bytes()[:-8] + b"\0" * 8)        # a flipped tail
    r = run(cli, ["inspect", str(out)])
    assert r.exit_code == 1 and "sha256" in r.stderr


def test_out_holds_one_exports_files_and_keeps_the_users(tmp_path):
    """Exporting into a directory that held another version's files left them beside the new
    ones: a per-head K of one version next to the files of the next."""
    import json as _json

    from click.testing import CliRunner

    from oscar_zoo.zoo.cli.main import cli
    from tests.utils.bundles import make_bundle

    per_head = make_bundle(tmp_path / "a", per_head=True)
    shared = make_bundle(tmp_path / "b", seed=1)
    out = tmp_path / "out"
    run = CliRunner().invoke
    assert run(cli, ["export", str(per_head.path), "--out", str(out)]).exit_code == 0
    (out / "notes.txt").write_text("mine")
    assert sorted(p.name for p in out.glob("*.pt")) == ["k_rotation_perhead.pt", "v_rotation_perhead.pt"]
    (out / "v_rotation_perhead.pt").write_bytes(b"edited by hand")         # not ours any more
    r = run(cli, ["export", str(shared.path), "--out", str(out)])
    assert r.exit_code == 0, r.output
    names = sorted(p.name for p in out.iterdir())
    assert names == [".oscar-zoo.json", "k_rotation_qqt_r_h_pbr.pt", "notes.txt",
                     "v_rotation_perhead.pt", "v_rotation_sst_r_h_pbr.pt"]
    mark = _json.loads((out / ".oscar-zoo.json").read_text())
    assert mark["format"] == "sglang" and sorted(mark["files"]) == ["k_rotation_qqt_r_h_pbr.pt",
                                                                     "v_rotation_sst_r_h_pbr.pt"]


def test_a_layers_output_exported_without_layers_is_not_served_for_the_whole_bundle(tmp_path):
    """A --layers output shares its whole bundle's digest. `export PART --format sglang` was
    cached as the whole bundle's export, so `export`/`pull --format sglang` of the whole bundle
    then served PART's three layers (SGLang stops at the first missing one); `--format
    safetensors` copied PART's tensors without its partial.json, which then failed inspect."""
    import json as _json

    from click.testing import CliRunner

    from oscar_zoo.zoo.cli.main import cli
    from tests.utils.bundles import make_bundle

    torch = pytest.importorskip("torch")
    bundle = make_bundle(tmp_path / "b")
    part = tmp_path / "part"
    run = CliRunner().invoke
    assert run(cli, ["export", str(bundle.path), "--format", "safetensors", "--layers", "0,2,4",
                     "--out", str(part)]).exit_code == 0
    r = run(cli, ["export", str(part), "--format", "sglang", "--out", str(tmp_path / "s1"), "--json"])
    assert r.exit_code == 0, r.output
    out = _json.loads(r.stdout)
    assert out["layers"] == [0, 2, 4]
    assert any("hold layers 0,2,4 only (3 layers" in n for n in out["recipe"]["notes"])
    r = run(cli, ["export", str(bundle.path), "--format", "sglang", "--out", str(tmp_path / "s2")])
    assert r.exit_code == 0, r.output
    k = torch.load(tmp_path / "s2" / "k_rotation_qqt_r_h_pbr.pt", weights_only=True)
    assert sorted(k["layers"]) == list(range(30))
    r = run(cli, ["export", str(part), "--format", "safetensors", "--out", str(tmp_path / "p2")])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "p2" / "partial.json").is_file()
    assert run(cli, ["inspect", str(tmp_path / "p2")]).exit_code == 0


def test_layers_a_layers_output_does_not_hold_are_refused_with_the_ones_it_does(tmp_path):
    from click.testing import CliRunner

    from oscar_zoo.zoo.cli.main import cli
    from tests.utils.bundles import make_bundle

    bundle = make_bundle(tmp_path / "b")
    run = CliRunner().invoke
    assert run(cli, ["export", str(bundle.path), "--format", "safetensors", "--layers", "0,2,4",
                     "--out", str(tmp_path / "part")]).exit_code == 0
    r = run(cli, ["export", str(tmp_path / "part"), "--layers", "1-3", "--out", str(tmp_path / "s")])
    assert r.exit_code == 1
    assert "holding layers 0,2,4 only, not 1,3: pass --layers within those" in r.stderr
    assert not (tmp_path / "s").exists()


def test_inspect_tells_the_int2_windows_and_the_layers_a_part_holds(tmp_path):
    """inspect showed only the group size of the INT2 cache (not the BF16 windows, scale dtype
    or Lloyd-Max a launch needs), and a --layers output as the whole model's layer count."""
    import json as _json

    from click.testing import CliRunner

    from oscar_zoo.zoo.cli.main import cli
    from tests.utils.bundles import make_bundle

    bundle = make_bundle(tmp_path / "b", model="qwen3-30b-a3b", per_head=True)
    run = CliRunner().invoke
    d = _json.loads(run(cli, ["inspect", str(bundle.path), "--json"]).stdout)
    assert (d["sink_tokens"], d["recent_tokens"], d["scale_dtype"], d["lloyd_max"]) == \
        (128, 1024, "float32", False)
    assert d["partial_layers"] is None
    assert run(cli, ["export", str(bundle.path), "--format", "safetensors", "--layers", "0-3",
                     "--out", str(tmp_path / "part")]).exit_code == 0
    r = run(cli, ["inspect", str(tmp_path / "part")])
    assert r.exit_code == 0, r.output
    assert "this --layers output holds 4: 0-3" in r.stdout
    assert "BF16 sink 128 + recent 1024" in r.stdout


def test_inspect_tells_how_much_text_the_validation_used(tmp_path):
    """inspect said "validated passed" and no more: a pass on two short windows read the same
    as one on many long ones."""
    import json as _json

    from click.testing import CliRunner

    from oscar_zoo.zoo.cli.main import cli
    from tests.api.ui.seeding import make_validated_bundle
    from tests.utils.bundles import make_bundle

    run = CliRunner().invoke
    bundle = make_validated_bundle(tmp_path / "b")
    report = bundle.manifest.validation
    assert (report.eval_windows, report.context_len) == (8, 4096)
    r = run(cli, ["inspect", str(bundle.path)])
    assert r.exit_code == 0, r.output
    assert "validated   passed on 8 held-out windows of 4,096 tokens (wikitext-2 test)" in r.stdout
    d = _json.loads(run(cli, ["inspect", str(bundle.path), "--json"]).stdout)
    assert d["validated"] is True
    assert d["validation"] == {"dataset": "wikitext-2 test", "eval_windows": 8,
                               "context_len": 4096, "eval_tokens": 32768}
    plain = make_bundle(tmp_path / "plain")
    assert _json.loads(run(cli, ["inspect", str(plain.path), "--json"]).stdout)["validation"] is None
    assert "validated   -" in run(cli, ["inspect", str(plain.path)]).stdout


def test_inspect_tells_the_windows_sliding_window_layers_were_validated_with(tmp_path):
    import json as _json

    from click.testing import CliRunner

    from oscar_zoo.zoo.bundle import Bundle, write
    from oscar_zoo.zoo.cli.main import cli
    from tests.api.ui.seeding import validation
    from tests.utils.bundles import make_manifest, make_tensors

    report = validation(30, 0, passed=False).model_copy(update={
        "eval_windows": 1, "window_by_layer": {"0": 512, "1": 512}})
    m = make_manifest().model_copy(update={"validation": report})
    write(Bundle(m, *make_tensors(m)), tmp_path / "b")
    r = CliRunner().invoke(cli, ["inspect", str(tmp_path / "b")])
    assert r.exit_code == 0, r.output
    assert ("validated   FAILED on 1 held-out window of 4,096 tokens (wikitext-2 test); "
            "2 sliding-window layers hold 512 tokens") in r.stdout
    d = _json.loads(CliRunner().invoke(cli, ["inspect", str(tmp_path / "b"), "--json"]).stdout)
    assert d["validation"]["window_by_layer"] == {"0": 512, "1": 512}


# --- the pass rule, one copy for validation and the registry ----------------------------------

def _report(passed: bool, criterion: str | None = None, tolerance: float = 0.05, **losses):
    """A report whose variants have the given extra losses (bundle_served= for bundle-served)."""
    from tests.api.ui.seeding import validation
    from oscar_zoo.zoo.manifest import VariantResult

    variants = [VariantResult(name=name.replace("_", "-"), delta_nll=d, kl=0.0, attn_rel_error=0.0)
                for name, d in losses.items()]
    from oscar_zoo.zoo.manifest import criterion_text

    # as validation words it: bundle-served judged where the report has it
    criterion = criterion or criterion_text(tolerance, 0.5, "bundle_served" in losses)
    return validation(2, 0).model_copy(update={"passed": passed, "criterion": criterion,
                                               "tolerance": tolerance, "variants": variants})


VERDICT_CASES = [
    dict(bundle=0.04, hadamard=0.2, naive=0.6),                      # passes
    dict(bundle=0.29, hadamard=0.2, naive=0.6),                      # naive bound: 0.3
    dict(bundle=0.31, hadamard=0.2, naive=0.6),
    dict(bundle=0.26, hadamard=0.2, naive=2.0),                      # hadamard bound: 0.25
    dict(bundle=0.04, bundle_served=0.26, hadamard=0.2, naive=0.6),
    dict(bundle=0.04, bundle_served=0.10, hadamard=0.2, naive=0.6),
    dict(bundle=0.04, hadamard=0.2, naive=0.0),                      # not judged
    dict(bundle=0.04, naive=0.6),
    dict(bundle=0.04),
]


@pytest.mark.parametrize("losses", VERDICT_CASES)
def test_the_verdict_is_the_documented_rule(losses):
    """zoo.manifest.verdict (validation's stored verdict, and the registry's check of an
    uploaded one) against the rule written out here: every judged variant (bundle, and
    bundle-served where the report has it) <= min(hadamard + 0.05, 0.5 x naive), with both
    baselines run and naive INT2 costing loss; anything else fails."""
    from oscar_zoo.calibrate.validate import ValidationConfig
    from oscar_zoo.zoo.manifest import verdict

    cfg = ValidationConfig()
    assert (cfg.tolerance, cfg.naive_fraction) == (0.05, 0.5)
    by = {r.name: r for r in _report(True, **losses).variants}
    judgeable = {"hadamard", "naive"} <= set(losses) and losses["naive"] > 0
    judged = [losses[n] for n in ("bundle", "bundle_served") if n in losses]
    expected = judgeable and max(judged) <= min(losses["hadamard"] + 0.05, 0.5 * losses["naive"])
    passed, criterion = verdict(by, cfg.tolerance, cfg.naive_fraction)
    assert passed == expected
    assert ("not judged" in criterion) == (not judgeable)


@pytest.mark.parametrize("losses", VERDICT_CASES)
def test_a_report_written_by_the_verdict_agrees_with_itself(losses):
    from oscar_zoo.zoo.manifest import verdict, verdict_disagreement

    by = {r.name: r for r in _report(True, **losses).variants}
    passed, criterion = verdict(by, 0.05, 0.5)
    assert verdict_disagreement(_report(passed, criterion, **losses)) is None
    assert verdict_disagreement(_report(not passed, criterion, **losses)) is not None


def test_a_passed_report_whose_bundle_is_far_worse_than_its_baselines_disagrees():
    from oscar_zoo.zoo.manifest import verdict_disagreement

    why = verdict_disagreement(_report(True, bundle=5.0, hadamard=0.0208, naive=0.1596))
    assert why == ("it says passed: true, but bundle's extra loss +5.0000 is above the bound "
                   "+0.0708 nats/token (hadamard +0.0208 + tolerance 0.05; 0.5 x naive +0.1596)")


def test_a_failed_report_whose_numbers_pass_disagrees():
    from oscar_zoo.zoo.manifest import verdict_disagreement

    why = verdict_disagreement(_report(False, bundle=0.01, bundle_served=0.02, hadamard=0.0208,
                                       naive=0.1596))
    assert why.startswith("it says passed: false, but bundle's extra loss +0.0100 and "
                          "bundle-served's extra loss +0.0200 are within the bound +0.0708")


def test_without_a_stated_naive_fraction_only_the_hadamard_bound_is_checked():
    """Validation stores the tolerance, not the naive fraction (only the criterion states it):
    a passed report must still be within Hadamard's + tolerance, and a failed one may have
    failed the unknown naive bound."""
    from oscar_zoo.zoo.manifest import verdict_disagreement

    plain = "extra loss <= Hadamard's + 0.05 nats"
    assert verdict_disagreement(_report(True, plain, bundle=0.24, hadamard=0.2, naive=0.3)) is None
    assert verdict_disagreement(_report(False, plain, bundle=0.01, hadamard=0.2, naive=0.6)) is None
    why = verdict_disagreement(_report(True, plain, bundle=0.26, hadamard=0.2, naive=9.0))
    assert "above the bound +0.2500 nats/token (hadamard +0.2000 + tolerance 0.05)" in why


@pytest.mark.parametrize("losses, says", [
    (dict(bundle=0.01, hadamard=0.2), "no naive variant"),
    (dict(hadamard=0.2, naive=0.6), "no bundle variant"),
])
def test_a_passed_report_that_cannot_be_judged_disagrees(losses, says):
    from oscar_zoo.zoo.manifest import verdict_disagreement

    why = verdict_disagreement(_report(True, **losses))
    assert why.startswith("it says passed: true, but it cannot be judged") and says in why
    assert verdict_disagreement(_report(False, **losses)) is None


def test_a_loss_on_the_bound_within_rounding_is_left_as_the_report_says():
    """The criterion states the naive fraction to 6 significant digits: a bound read back from
    it may differ from the one validation used in the last digits."""
    from oscar_zoo.zoo.manifest import verdict_disagreement

    stated = "extra loss <= Hadamard's + 0.05 nats and <= 0.333333 x naive INT2's"
    on_bound = 0.6 / 3          # 1/3 x naive, as validation judged it: a pass
    for passed in (True, False):
        assert verdict_disagreement(_report(passed, stated, bundle=on_bound, hadamard=0.2,
                                            naive=0.6)) is None


@pytest.mark.parametrize("criterion, passed", [
    # 9fa268a..6fd090b measured bundle-served without judging it: the bundle alone passed
    ("extra loss <= Hadamard's + 0.05 nats and <= 0.5 x naive INT2's", True),
    # today's: bundle-served judged too, so the same numbers fail
    ("extra loss <= Hadamard's + 0.05 nats and <= 0.5 x naive INT2's, for the bundle and as "
     "engines serve it (bundle-served); failed by bundle-served", False),
])
def test_a_report_agrees_with_itself_under_the_rule_its_criterion_states(criterion, passed):
    """The rule changed: reports `oscar-zoo validate` wrote in earlier versions must not be
    refused as contradicting themselves (bundle 0.05 passes, bundle-served 0.09 does not)."""
    from oscar_zoo.zoo.manifest import verdict_disagreement

    losses = dict(bundle=0.05, bundle_served=0.09, hadamard=0.03, naive=0.4)
    assert verdict_disagreement(_report(passed, criterion, **losses)) is None
    assert verdict_disagreement(_report(not passed, criterion, **losses)) is not None


def test_an_old_report_with_a_free_naive_int2_is_judged_by_the_bound_as_it_came():
    """Before naive INT2 costing nothing was 'not judged', the bound min(h + tol, f x naive)
    applied as it came: a passed: true whose numbers met it agrees with itself."""
    from oscar_zoo.zoo.manifest import verdict_disagreement

    old = _report(True, bundle=-0.02, hadamard=0.01, naive=-0.01)      # bound: -0.005
    assert verdict_disagreement(old) is None
    assert verdict_disagreement(_report(True, bundle=0.02, hadamard=0.01, naive=-0.01)) is not None
