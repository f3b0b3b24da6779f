"""OSCAR SGLang checkpoints: import real RotationZoo files, export the exact schema, round trip,
and refuse pickles that would run code."""

from __future__ import annotations

import json
import os
import pickle
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from oscar_zoo.zoo import bundle as B
from oscar_zoo.zoo.catalog import lookup, resolve
from oscar_zoo.zoo.cli.main import cli
from oscar_zoo.zoo.errors import BundleFormatError, InvalidInput, UnsafePickleError
from oscar_zoo.zoo.interop import oscar_pt
from oscar_zoo.zoo.interop.convert import (ServingDefaults, bundle_from_oscar, export_files,
                                           import_files, oscar_names)

FIXTURES = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures" / "oscar-rotationzoo"
QWEN3_4B = FIXTURES / "Qwen3-4B-Thinking-2507"
QWEN35 = FIXTURES / "Qwen3.5-35B-A3B"

needs_fixtures = pytest.mark.skipif(not QWEN3_4B.is_dir(), reason=f"RotationZoo fixtures not at {FIXTURES}")


def _import(folder: Path, k: str, v: str, model: str) -> B.Bundle:
    entry = lookup(model)
    return import_files(folder / k, folder / v, entry, ServingDefaults.of(entry))


@needs_fixtures
def test_import_real_qwen3_4b_files(tmp_path):
    b = _import(QWEN3_4B, "k_rotation_qqt_r_h_pbr.pt", "v_rotation_sst_r_h_pbr.pt", "qwen3-4b-thinking-2507")
    written = B.write(b, tmp_path / "b")
    m = B.verify_bundle(tmp_path / "b")
    assert written.layers == list(range(36))
    assert (m.method.k_objective, m.method.v_objective, m.method.composition) == ("qqt", "sst", "r_h_pbr")
    assert m.calibration.source == "imported" and m.method.granularity == "layer"
    raw = torch.load(QWEN3_4B / "k_rotation_qqt_r_h_pbr.pt", weights_only=True)
    np.testing.assert_array_equal(written.k[7].rotation, raw["layers"][7]["rotation"].numpy())
    np.testing.assert_array_equal(written.k[7].eigenvalues, raw["layers"][7]["eigenvalues"].numpy())
    assert (written.k[0].clip == np.float32(0.96)).all() and (written.v[0].clip == np.float32(0.92)).all()


@needs_fixtures
def test_hybrid_file_keeps_global_layer_ids_and_round_trips_exactly(tmp_path):
    b = _import(QWEN35, "k_rotation.pt", "v_rotation.pt", "qwen3.5-35b-a3b")
    assert b.layers == [3, 7, 11, 15, 19, 23, 27, 31, 35, 39]
    k_path, v_path = export_files(b, tmp_path / "sglang")
    for ours, theirs in ((k_path, QWEN35 / "k_rotation.pt"), (v_path, QWEN35 / "v_rotation.pt")):
        a, r = torch.load(ours, weights_only=True), torch.load(theirs, weights_only=True)
        assert a["format_version"] == r["format_version"] == 1
        assert (a["objective"], a["source_grouping"]) == (r["objective"], r["source_grouping"])
        assert sorted(a["layers"]) == sorted(r["layers"])
        for lid in r["layers"]:
            assert isinstance(next(iter(a["layers"])), int)
            assert set(a["layers"][lid]) == {"layer_id", "rotation", "eigenvalues"}
            assert a["layers"][lid]["layer_id"] == lid
            assert torch.equal(a["layers"][lid]["rotation"], r["layers"][lid]["rotation"])
            assert a["layers"][lid]["rotation"].dtype == torch.float32


@needs_fixtures
def test_a_model_oscar_serves_with_lloyd_max_gets_the_flag_and_why(tmp_path):
    """The catalog knew no model served with SGLANG_LLOYD_MAX=1, so pulling Qwen3.5-35B-A3B or
    MiniMax-M2.7 from the RotationZoo printed a recipe without OSCAR's setting for them."""
    from oscar_zoo.zoo.recipes import sglang_recipe

    b = _import(QWEN35, "k_rotation.pt", "v_rotation.pt", "qwen3.5-35b-a3b")
    assert b.manifest.quantization.lloyd_max
    recipe = sglang_recipe(b.manifest, "k.pt", "v.pt")
    assert recipe.env["SGLANG_LLOYD_MAX"] == "1"
    assert any("uniform INT2" in n for n in recipe.notes)
    plain = _import(QWEN3_4B, "k_rotation_qqt_r_h_pbr.pt", "v_rotation_sst_r_h_pbr.pt",
                    "qwen3-4b-thinking-2507")
    assert "SGLANG_LLOYD_MAX" not in sglang_recipe(plain.manifest, "k.pt", "v.pt").env


@needs_fixtures
def test_files_for_another_model_are_refused(tmp_path):
    with pytest.raises(BundleFormatError, match="attention layers"):
        _import(QWEN35, "k_rotation.pt", "v_rotation.pt", "qwen3-8b")
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"num_hidden_layers": 36, "num_attention_heads": 16,
                                  "num_key_value_heads": 8, "head_dim": 64}))
    entry = resolve("my-org/other-model", config)
    with pytest.raises(BundleFormatError, match=r"rotation \(128, 128\), model needs \(64, 64\)"):
        import_files(QWEN3_4B / "k_rotation_qqt_r_h_pbr.pt", QWEN3_4B / "v_rotation_sst_r_h_pbr.pt",
                     entry, ServingDefaults.of(entry))


def _random_oscar(layers, d, heads=None, seed=0, fv=1, objective="qqt_r_h_pbr", k_mean=False):
    rng = np.random.default_rng(seed)
    f = oscar_pt.OscarFile(fv, objective, "per_kv_head" if heads else "layer")
    for lid in layers:
        shape = (heads, d, d) if heads else (d, d)
        rot = np.linalg.qr(rng.standard_normal(shape))[0].astype(np.float32)
        eig = None if heads else np.sort(rng.random(d)).astype(np.float32)
        mean = rng.standard_normal((heads or 3, d)).astype(np.float32) if k_mean else None
        f.layers[lid] = oscar_pt.OscarLayer(rot, eig, mean)
    return f


def test_per_head_format2_round_trip(tmp_path):
    entry = lookup("smollm2-135m")
    k = _random_oscar(range(30), 64, heads=3, fv=2, objective="cov_eig_hadamard_perhead")
    v = _random_oscar(range(30), 64, heads=3, seed=1, fv=2, objective="cov_eig_hadamard_perhead")
    b = bundle_from_oscar(k, v, entry, ServingDefaults.of(entry), "test")
    assert b.manifest.method.granularity == "kv_head"
    B.write(b, tmp_path / "b")
    back = B.read(tmp_path / "b")
    k_path, v_path = export_files(back, tmp_path / "out")
    assert (k_path.name, v_path.name) == ("k_rotation_perhead.pt", "v_rotation_perhead.pt")
    raw = torch.load(k_path, weights_only=True)
    assert raw["format_version"] == 2 and raw["source_grouping"] == "per_kv_head"
    assert set(raw["layers"][5]) == {"layer_id", "rotation"}        # format 2: no eigenvalues
    assert raw["layers"][5]["rotation"].shape == (3, 64, 64)
    np.testing.assert_array_equal(raw["layers"][5]["rotation"].numpy(), k.layers[5].rotation)


def test_key_centering_exports_format3_k_mean_and_reads_it_back(tmp_path):
    entry = lookup("smollm2-135m")
    k = _random_oscar(range(30), 64, k_mean=True)
    v = _random_oscar(range(30), 64, seed=2, objective="sst_r_h_pbr")
    b = bundle_from_oscar(k, v, entry, ServingDefaults.of(entry), "test")
    assert b.manifest.method.key_centering
    k_path, v_path = export_files(b, tmp_path)
    raw = torch.load(k_path, weights_only=True)
    assert raw["format_version"] == 3 and raw["transform"]["centered"] is True
    assert raw["layers"][4]["k_mean"].shape == (3, 64)
    again = oscar_pt.read_file(k_path)
    np.testing.assert_array_equal(again.layers[4].k_mean, k.layers[4].k_mean)
    assert torch.load(v_path, weights_only=True)["format_version"] == 1


def test_hadamard_files_export_oscars_objective_and_round_trip(tmp_path):
    from tests.calibrate.reference import hadamard

    entry = lookup("smollm2-135m")
    h = hadamard(64).astype(np.float32)
    obj = {"format_version": 1, "objective": "hadamard", "source_grouping": "layer",
           "layers": {i: {"layer_id": i, "rotation": torch.from_numpy(h),
                          "eigenvalues": torch.ones(64)} for i in range(30)}}
    torch.save(obj, tmp_path / "k.pt")
    torch.save(obj, tmp_path / "v.pt")
    b = import_files(tmp_path / "k.pt", tmp_path / "v.pt", entry, ServingDefaults.of(entry))
    assert (b.manifest.method.k_objective, b.manifest.method.v_objective) == ("hadamard", "hadamard")
    k_path, v_path = export_files(b, tmp_path / "out")
    assert k_path.name == "k_rotation_hadamard.pt"
    assert torch.load(k_path, weights_only=True)["objective"] == "hadamard"  # as OSCAR writes it
    again = import_files(k_path, v_path, entry, ServingDefaults.of(entry))
    assert (again.manifest.method.k_objective, again.manifest.method.v_objective) == ("hadamard", "hadamard")


@pytest.mark.parametrize("k_objective, v_objective, v_name", [
    ("qqt_r_h_pbr", "hadamard", "v_rotation_hadamard.pt"),
    ("qqt_r_h_pbr", "sst_pbr", "v_rotation_sst_pbr.pt"),
    ("hadamard", "sst_r_h", "v_rotation_sst_r_h.pt"),
])
def test_a_pair_made_with_two_recipes_exports_each_side_under_its_own(tmp_path, k_objective,
                                                                       v_objective, v_name):
    """K's composition used to stand for both: V came back out as `hadamard_r_h_pbr` (an
    objective that re-imports as unknown) or under K's composition's file name."""
    entry = lookup("smollm2-135m")
    k = _random_oscar(range(30), 64, seed=1, objective=k_objective)
    v = _random_oscar(range(30), 64, seed=2, objective=v_objective)
    b = bundle_from_oscar(k, v, entry, ServingDefaults.of(entry), "test")
    B.write(b, tmp_path / "b")
    k_path, v_path = export_files(B.read(tmp_path / "b"), tmp_path / "out")
    assert v_path.name == v_name
    assert torch.load(k_path, weights_only=True)["objective"] == k_objective
    assert torch.load(v_path, weights_only=True)["objective"] == v_objective
    again = import_files(k_path, v_path, entry, ServingDefaults.of(entry))
    assert again.manifest.method == b.manifest.method


@pytest.mark.parametrize("shape", [(5, 64), (3, 32)])
def test_k_mean_of_the_wrong_shape_is_a_clear_error(shape):
    entry = lookup("smollm2-135m")
    k = _random_oscar(range(30), 64, k_mean=True)
    for layer in k.layers.values():
        layer.k_mean = np.zeros(shape, np.float32)
    v = _random_oscar(range(30), 64, seed=2, objective="sst_r_h_pbr")
    with pytest.raises(BundleFormatError, match=r"k layer 0: k_mean \(\d+, \d+\), model needs"):
        bundle_from_oscar(k, v, entry, ServingDefaults.of(entry), "test")


def test_identity_v1_variant_imports(tmp_path):
    entry = lookup("smollm2-135m")
    obj = {"format_version": "identity-v1", "objective": "identity-k", "source_grouping": "identity",
           "layers": {i: {"layer_id": i, "rotation": torch.eye(64)} for i in range(30)}}
    torch.save(obj, tmp_path / "k.pt")
    torch.save({**obj, "objective": "identity-v"}, tmp_path / "v.pt")
    b = import_files(tmp_path / "k.pt", tmp_path / "v.pt", entry, ServingDefaults.of(entry))
    assert b.manifest.method.k_objective == "identity" and b.k[0].eigenvalues is None
    B.write(b, tmp_path / "b")
    assert oscar_names(b.manifest)[0].startswith("k_rotation_identity")


def test_non_orthogonal_companion_transform_is_refused(tmp_path):
    rot = torch.eye(64)
    obj = {"format_version": 3, "objective": "oscar2_whiten", "source_grouping": "layer",
           "layers": {0: {"layer_id": 0, "rotation": rot, "q_rotation": 2 * rot}}}
    with pytest.raises(BundleFormatError, match="non-orthogonal"):
        oscar_pt.parse(obj)


def test_a_layer_keyed_both_as_int_and_as_str_is_refused(tmp_path):
    # Loaders take both 3 and "3" as layer 3; with both in one file, which rotation is served
    # would depend on dict order. Two different rotations make a silent pick visible.
    obj = {"format_version": 1, "objective": "qqt_r_h_pbr", "source_grouping": "layer",
           "layers": {3: {"layer_id": 3, "rotation": torch.eye(8)},
                      "3": {"layer_id": 3, "rotation": -torch.eye(8)}}}
    torch.save(obj, tmp_path / "k.pt")
    with pytest.raises(BundleFormatError, match=r"k\.pt: has layer 3 twice \(keys 3 and '3'\)"):
        oscar_pt.read_file(tmp_path / "k.pt")


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_malicious_pickle_is_refused_without_running(tmp_path):
    marker = tmp_path / "pwned"
    evil = tmp_path / "k_rotation_qqt_r_h_pbr.pt"
    torch.save({"format_version": 1, "layers": {0: {"rotation": torch.eye(4)}}, "x": _Evil(marker)}, evil)
    assert zipfile.is_zipfile(evil)
    with pytest.raises(UnsafePickleError, match="refused"):
        oscar_pt.read_file(evil)
    assert not marker.exists()
    # a raw (non-zip) pickle too
    raw = tmp_path / "raw.pt"
    raw.write_bytes(pickle.dumps(_Evil(marker)))
    with pytest.raises((UnsafePickleError, BundleFormatError)):
        oscar_pt.read_file(raw)
    assert not marker.exists()


@needs_fixtures
def test_cli_convert_both_ways(tmp_path):
    runner = CliRunner()
    res = runner.invoke(cli, ["convert", "--from", "sglang", str(QWEN3_4B), "--model",
                              "Qwen/Qwen3-4B-Thinking-2507", "--out", str(tmp_path / "b"), "--json"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(cli, ["inspect", str(tmp_path / "b"), "--json"])
    assert res.exit_code == 0 and '"layers": 36' in res.output
    res = runner.invoke(cli, ["convert", "--to", "sglang", str(tmp_path / "b"), "--out", str(tmp_path / "s")])
    assert res.exit_code == 0, res.output
    a = torch.load(tmp_path / "s" / "k_rotation_qqt_r_h_pbr.pt", weights_only=True)
    r = torch.load(QWEN3_4B / "k_rotation_qqt_r_h_pbr.pt", weights_only=True)
    assert all(torch.equal(a["layers"][i]["rotation"], r["layers"][i]["rotation"]) for i in range(36))


def test_cli_convert_refuses_to_guess_between_files(tmp_path):
    for name in ("k_rotation_qqt_r_h_pbr.pt", "k_rotation_perhead.pt", "v_rotation_sst_r_h_pbr.pt"):
        (tmp_path / name).write_bytes(b"")
    res = CliRunner().invoke(cli, ["convert", "--from", "sglang", str(tmp_path), "--model", "qwen3-8b",
                                   "--out", str(tmp_path / "b")])
    assert res.exit_code == 1 and "name the K and V files explicitly" in res.output


@pytest.mark.parametrize("objective", ["qqt_r_h_pbr_fast", "ktk_newcomp"])
def test_an_objective_from_a_newer_oscar_imports_as_imported(objective):
    """A suffix that is no composition we know used to fail the manifest's schema with a raw
    pydantic traceback; the rotations load fine, only the label is unknown."""
    entry = lookup("smollm2-135m")
    k = _random_oscar(range(30), 64, seed=1, objective=objective)
    v = _random_oscar(range(30), 64, seed=2, objective="sst_r_h_pbr")
    b = bundle_from_oscar(k, v, entry, ServingDefaults.of(entry), "test")
    assert (b.manifest.method.k_objective, b.manifest.method.composition) == ("imported", "none")
    np.testing.assert_array_equal(b.k[3].rotation, k.layers[3].rotation)


@needs_fixtures
def test_k_and_v_files_given_the_wrong_way_round_are_refused():
    """The pair used to import as objectives 'imported'/'imported', so SGLang would rotate keys
    with V's sst rotation (and values with K's): no error anywhere, only a collapsed model."""
    entry = lookup("qwen3-4b-thinking-2507")
    with pytest.raises(BundleFormatError, match=r"K file .*'sst_r_h_pbr'.* swapped"):
        import_files(QWEN3_4B / "v_rotation_sst_r_h_pbr.pt", QWEN3_4B / "k_rotation_qqt_r_h_pbr.pt",
                     entry, ServingDefaults.of(entry))


@pytest.mark.parametrize("k_objective, v_objective", [
    ("oscar2_v_post_wo", "sst_r_h_pbr"),     # format 3: a V file's objective in the K slot
    ("qqt_r_h_pbr", "ktk_r_h_pbr"),          # a K objective in the V slot
])
def test_a_side_whose_objective_names_the_other_side_is_refused(k_objective, v_objective):
    entry = lookup("smollm2-135m")
    k = _random_oscar(range(30), 64, seed=1, objective=k_objective)
    v = _random_oscar(range(30), 64, seed=2, objective=v_objective)
    with pytest.raises(BundleFormatError, match="swapped"):
        bundle_from_oscar(k, v, entry, ServingDefaults.of(entry), "test")


def _smollm_pair(folder: Path) -> tuple[Path, Path]:
    """A K/V pair of OSCAR files for the test model, as torch.save writes them."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for side, objective, seed in (("k", "qqt_r_h_pbr", 1), ("v", "sst_r_h_pbr", 2)):
        f = _random_oscar(range(30), 64, seed=seed, objective=objective)
        layers = {i: {"layer_id": i, "rotation": torch.from_numpy(layer.rotation)}
                  for i, layer in f.layers.items()}
        paths.append(folder / f"{side}_rotation_{objective}.pt")
        torch.save({"format_version": 1, "objective": objective, "source_grouping": "layer",
                    "layers": layers}, paths[-1])
    return paths[0], paths[1]


def test_convert_overwrite_replaces_only_a_bundle(tmp_path):
    """--overwrite swapped the whole --out directory for the bundle: a mistyped --out (a
    models folder, a home directory) lost every file in it."""
    k, v = _smollm_pair(tmp_path / "oscar")
    mine = tmp_path / "models"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    args = ["convert", "--from", "sglang", str(k), str(v), "--model", "smollm2-135m", "--overwrite"]
    r = CliRunner().invoke(cli, args + ["--out", str(mine)])
    assert r.exit_code == 2 and "--overwrite replaces only a bundle" in r.stderr
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
    assert CliRunner().invoke(cli, args + ["--out", str(tmp_path / "b")]).exit_code == 0
    r = CliRunner().invoke(cli, args + ["--out", str(tmp_path / "b"), "--k-clip", "0.9"])
    assert r.exit_code == 0, r.output
    assert B.read_manifest(tmp_path / "b").clip.k_global == pytest.approx(0.9)


@pytest.mark.parametrize("flags, message", [
    (["--k-clip", "1.5"], "--k-clip 1.5: a clip ratio is the share of each row's |x| kept"),
    (["--v-clip", "-0.1"], "--v-clip -0.1: a clip ratio"),
    (["--v-clip", "nan"], "--v-clip nan: a clip ratio"),
    (["--group-size", "0"], "--group-size 0: pass a positive power of two"),
    (["--group-size", "48"], "group_size 48 must be a power of two dividing head_dim (64)"),
    (["--group-size", "8"], "group_size 8 is below head_dim/4 = 16"),
])
def test_convert_refuses_settings_no_engine_can_serve_saying_what_to_pass(tmp_path, flags, message):
    """A clip ratio outside [0, 1] or a group size of 0 ended in a pydantic traceback; a group
    size the INT2 kernels cannot take was recorded, and every launch recipe then passed it."""
    k, v = _smollm_pair(tmp_path / "oscar")
    r = CliRunner().invoke(cli, ["convert", "--from", "sglang", str(k), str(v), "--model",
                                 "smollm2-135m", "--out", str(tmp_path / "b"), *flags])
    assert r.exit_code == 1 and message in r.stderr, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)
    assert not (tmp_path / "b").exists()


def test_convert_to_sglang_writes_k_and_v_together_or_neither(tmp_path):
    """K was written, then V: a failure (or Ctrl-C) at V left a new K beside the old V, a pair
    SGLang loads without a word (both [d, d]) and serves garbled."""
    from tests.utils.bundles import make_bundle

    one, two = make_bundle(tmp_path / "one"), make_bundle(tmp_path / "two", seed=1)
    out = tmp_path / "sglang"
    k_path, v_path = export_files(one, out)
    before = k_path.read_bytes()
    v_path.unlink()
    v_path.mkdir()          # V cannot be written
    with pytest.raises(InvalidInput, match=r"--out .*sglang: cannot write there"):
        export_files(two, out)
    assert k_path.read_bytes() == before
    assert sorted(p.name for p in out.iterdir()) == [k_path.name, v_path.name]   # no temp files


def test_convert_to_sglang_into_a_file_says_which_out(tmp_path):
    from tests.utils.bundles import make_bundle

    make_bundle(tmp_path / "b")
    (tmp_path / "taken").write_text("")
    r = CliRunner().invoke(cli, ["convert", "--to", "sglang", str(tmp_path / "b"), "--out",
                                 str(tmp_path / "taken")])
    assert r.exit_code == 1 and "taken: cannot create that directory" in r.stderr, r.output


def test_convert_to_sglang_never_replaces_files_it_did_not_write(tmp_path):
    """`convert --to sglang` wrote OSCAR's file names over a RotationZoo checkout's own (another
    model's rotations under the name its SGLang launch points at) where `export --out` refuses;
    and it left no mark, so a later export there refused its own files."""
    from tests.utils.bundles import make_bundle

    bundle = make_bundle(tmp_path / "b", model="qwen3-8b")
    out = tmp_path / "checkout"
    out.mkdir()
    names = oscar_names(bundle.manifest)
    for name in names:
        (out / name).write_bytes(b"the user's own rotations " + name.encode())
    before = {n: (out / n).read_bytes() for n in names}
    args = ["convert", "--to", "sglang", str(bundle.path), "--out", str(out)]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 1 and "which oscar-zoo did not write there" in r.stderr, r.output
    assert {n: (out / n).read_bytes() for n in names} == before and r.stdout == ""
    fresh = tmp_path / "fresh"
    assert CliRunner().invoke(cli, args[:-1] + [str(fresh)]).exit_code == 0
    r = CliRunner().invoke(cli, ["export", str(bundle.path), "--format", "sglang", "--out", str(fresh)])
    assert r.exit_code == 0, r.output                 # its own files, marked as such
    assert CliRunner().invoke(cli, args[:-1] + [str(fresh)]).exit_code == 0


def test_convert_to_sglang_warns_that_searched_per_head_clips_are_lost(tmp_path):
    """The .pt files carry no clip ratios and SGLang takes one pair per server: converting a
    bundle of clips searched per KV head dropped them without a word, and without saying which
    pair to launch with."""
    from oscar_zoo.zoo.recipes import sglang_recipe
    from tests.api.ui.seeding import make_validated_bundle

    bundle = make_validated_bundle(tmp_path / "b")
    clip = bundle.manifest.clip
    env = sglang_recipe(bundle.manifest, "k.pt", "v.pt").env
    pair = (f"SGLANG_OSCAR_K_CLIP_RATIO={env['SGLANG_OSCAR_K_CLIP_RATIO']} and "
            f"SGLANG_OSCAR_V_CLIP_RATIO={env['SGLANG_OSCAR_V_CLIP_RATIO']}")
    assert env["SGLANG_OSCAR_K_CLIP_RATIO"] == f"{clip.k_global:g}"
    args = ["convert", "--to", "sglang", str(bundle.path), "--out", str(tmp_path / "s")]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    warned = [line for line in r.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warned) == 1 and pair in warned[0], r.stderr
    assert "searched per KV head" in warned[0] and "per-KV-head values are lost" in warned[0]
    assert "with that pair, " in warned[0]            # what validation measured it costs
    assert r.stdout.splitlines() == [str(tmp_path / "s" / n) for n in oscar_names(bundle.manifest)]
    r = CliRunner().invoke(cli, args + ["--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert len(data["notes"]) == 1 and pair in data["notes"][0] and warned[0].endswith(data["notes"][0])
    assert "warning" not in r.stderr                  # --json carries it, as pull --json does


def test_convert_to_sglang_says_nothing_of_global_unsearched_clips(tmp_path):
    from tests.utils.bundles import make_bundle

    bundle = make_bundle(tmp_path / "b")
    args = ["convert", "--to", "sglang", str(bundle.path), "--out", str(tmp_path / "s")]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0 and r.stderr == "", r.output
    assert json.loads(CliRunner().invoke(cli, args + ["--json"]).stdout)["notes"] == []


def _bundle_with(clip_update: dict, head_clip: float | None = None) -> B.Bundle:
    from tests.utils.bundles import make_manifest, make_tensors

    m = make_manifest()
    m = m.model_copy(update={"clip": m.clip.model_copy(update=clip_update)})
    k, v = make_tensors(m)
    if head_clip is not None:
        k[3].clip[1] = head_clip
    return B.Bundle(m, k, v)


@pytest.mark.parametrize("clip_update, head_clip, says", [
    ({"granularity": "layer", "searched": True}, None, "searched per layer (K 0.96, V 0.92); "),
    ({"searched": True}, None, "SGLang serves whatever pair it is launched with"),
    ({}, 0.9, "set per KV head (K 0.9-0.96, V 0.92); "),   # a global manifest, uneven tensors
])
def test_the_clip_note_tells_what_the_sglang_files_lose(clip_update, head_clip, says):
    from oscar_zoo.zoo.interop.convert import clip_note

    note = clip_note(_bundle_with(clip_update, head_clip))
    assert says in note, note
    assert "SGLANG_OSCAR_K_CLIP_RATIO=0.96 and SGLANG_OSCAR_V_CLIP_RATIO=0.92" in note
    assert ("values are lost" in note) == (clip_update.get("granularity") == "layer" or bool(head_clip))
    assert clip_note(_bundle_with({})) is None


def test_the_clip_note_names_a_global_pair_other_than_oscars():
    """A global, unsearched pair of its own (a job spec's k_clip, an import's --k-clip) is lost
    in the files as much as a searched one: SGLang serves whatever it is launched with."""
    from oscar_zoo.zoo.interop.convert import clip_note

    bundle = _bundle_with({"k_global": 0.9, "k_min": 0.9, "k_median": 0.9, "k_max": 0.9})
    for t in bundle.k.values():
        t.clip[:] = 0.9
    note = clip_note(bundle)
    assert note is not None and "set (K 0.9, V 0.92)" in note, note
    assert "SGLANG_OSCAR_K_CLIP_RATIO=0.9 and SGLANG_OSCAR_V_CLIP_RATIO=0.92" in note
    assert "values are lost" not in note


def _gemma3n_like(tmp_path, shared_like_source: bool) -> tuple[Path, Path, Path]:
    """A config whose last 4 layers read earlier layers' caches (Gemma 3n's layout: layer 9,
    full attention, reads 4; 6-8, sliding, read 5), and OSCAR files giving each layer its own
    rotation, or the readers their source's."""
    kinds = ["sliding_attention"] * 4 + ["full_attention"] + ["sliding_attention"] * 4 + ["full_attention"]
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "gemma3n", "text_config": {
        "num_hidden_layers": 10, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64,
        "hidden_size": 512, "layer_types": kinds, "num_kv_shared_layers": 4}}))
    paths = []
    for side, objective, seed in (("k", "qqt_r_h_pbr", 1), ("v", "sst_r_h_pbr", 2)):
        f = _random_oscar(range(10), 64, seed=seed, objective=objective)
        if shared_like_source:
            for reader, source in {6: 5, 7: 5, 8: 5, 9: 4}.items():
                f.layers[reader] = f.layers[source]
        paths.append(tmp_path / f"{side}_rotation_{objective}.pt")
        oscar_pt.write_file(paths[-1], f)
    return config, paths[0], paths[1]


@pytest.mark.parametrize("shared_like_source", [False, True])
def test_convert_names_kv_shared_layers_whose_files_give_them_their_own_rotations(tmp_path,
                                                                                  shared_like_source):
    """OSCAR's files give every layer its own rotation; on a KV-shared model an engine reads a
    shared layer's cache as its source wrote it but looks tensors up by the layer's own id.
    convert imported such files without a word (validate now refuses the bundle)."""
    config, k, v = _gemma3n_like(tmp_path, shared_like_source)
    args = ["convert", "--from", "sglang", str(k), str(v), "--model", "my-org/gemma3n-like",
            "--config", str(config), "--out", str(tmp_path / "b")]
    r = CliRunner().invoke(cli, args + ["--json"])
    assert r.exit_code == 0, r.output
    warnings = json.loads(r.stdout)["warnings"]
    if shared_like_source:
        assert warnings == [] and "warning" not in r.stderr
        return
    assert len(warnings) == 1 and "warning" not in r.stderr, r.stderr     # --json carries it
    assert ("rotation K, rotation V on layers 6 (source 5), 7 (source 5), 8 (source 5), "
            "9 (source 4)") in warnings[0] and "validate` refuses" in warnings[0]
    r = CliRunner().invoke(cli, args + ["--overwrite"])
    assert r.exit_code == 0 and f"warning: {warnings[0]}" in " ".join(r.stderr.split()), r.stderr
