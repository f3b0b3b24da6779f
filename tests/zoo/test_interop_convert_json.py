"""`oscar-zoo convert --from sglang`: its --json says what its text says (verified, where the
bundle went), and a model the catalog does not know keeps the architecture its config names."""

from __future__ import annotations

import json

import numpy as np
from click.testing import CliRunner

from oscar_zoo.zoo import bundle as B
from oscar_zoo.zoo.cli.main import cli
from oscar_zoo.zoo.interop import oscar_pt


def _tiny_llama(tmp_path):
    """config.json of a model no catalog knows (2 layers, 2 KV heads of 64) and OSCAR files."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 256,
        "head_dim": 64}))
    rng = np.random.default_rng(0)
    paths = []
    for side, objective in (("k", "qqt_r_h_pbr"), ("v", "sst_r_h_pbr")):
        f = oscar_pt.OscarFile(1, objective, "layer")
        for lid in range(2):
            rot = np.linalg.qr(rng.standard_normal((64, 64)))[0].astype(np.float32)
            f.layers[lid] = oscar_pt.OscarLayer(rot, np.sort(rng.random(64)).astype(np.float32))
        paths.append(tmp_path / f"{side}_rotation_{objective}.pt")
        oscar_pt.write_file(paths[-1], f)
    return config, *paths


def _convert(tmp_path, *extra):
    config, k, v = _tiny_llama(tmp_path)
    out = tmp_path / "b"
    r = CliRunner().invoke(cli, ["convert", "--from", "sglang", str(k), str(v), "--model",
                                 "myorg/Tiny-Model", "--config", str(config), "--out", str(out),
                                 *extra])
    assert r.exit_code == 0, r.output
    return r, out


def test_convert_json_says_verified_and_where_the_bundle_is(tmp_path):
    """The text ended "verified yes: hashes, shapes, finiteness, orthogonality"; --json had no
    `verified` (inspect --json has it) and no output path."""
    r, out = _convert(tmp_path, "--json")
    data = json.loads(r.stdout)
    assert data["verified"] is True and data["path"] == str(out)
    inspected = json.loads(CliRunner().invoke(cli, ["inspect", str(out), "--json"]).stdout)
    assert inspected["verified"] is True
    text, _ = _convert(tmp_path / "again")
    assert "verified    yes: hashes, shapes, finiteness, orthogonality" in text.stdout


def test_convert_records_the_architecture_its_config_names(tmp_path):
    """A model the catalog does not know was recorded as architecture "unknown", though its
    config.json says LlamaForCausalLM."""
    _, out = _convert(tmp_path)
    assert B.read_manifest(out).model.architecture == "LlamaForCausalLM"
