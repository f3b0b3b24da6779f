"""The client path stays light: `--help`, a cold hub pull and a warm pull never import torch or
triton, and the warm pull imports no numpy, safetensors or pydantic either (measured with
`python -X importtime` in a fresh process, the way a user runs it)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from oscar_zoo.zoo.pull import pull

HEAVY = ("torch", "triton")
WARM_FORBIDDEN = HEAVY + ("numpy", "safetensors", "pydantic", "modelscope_hub")


def imported_modules(*args: str) -> tuple[set[str], subprocess.CompletedProcess]:
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "oscar_zoo.zoo.cli.main", *args],
                          capture_output=True, text=True, env=os.environ.copy(), timeout=120)
    mods = set()
    for line in proc.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            mods.add(line.rsplit("|", 1)[1].strip().split(".")[0])
    return mods, proc


def test_help_imports_nothing_heavy():
    mods, proc = imported_modules("--help")
    assert proc.returncode == 0 and "pull" in proc.stdout
    assert not mods & set(WARM_FORBIDDEN + ("httpx", "huggingface_hub")), mods & set(WARM_FORBIDDEN)


def test_only_the_cold_rotationzoo_import_uses_torch(seed_zoo):
    seed_zoo(("hf",))
    mods, proc = imported_modules("pull", "glm-4.7-fp8", "-q")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "SGLANG_OSCAR_K_ROTATION_PATH" in proc.stdout
    # the zoo's pickles are opened with torch.load(weights_only=True), and nothing else
    assert "torch" in mods and "triton" not in mods
    mods, proc = imported_modules("pull", "glm-4.7-fp8", "-q")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not mods & set(WARM_FORBIDDEN), "a warm pull imported " + str(mods & set(WARM_FORBIDDEN))


def test_warm_registry_pull_is_light(tmp_path, monkeypatch, hub):
    from tests.utils.bundles import make_bundle
    from tests.utils.databases import fresh_database
    from tests.utils.registry_server import run_registry

    bundle = make_bundle(tmp_path / "b", model="qwen3-8b")
    with fresh_database("sqlite", tmp_path) as url, run_registry(url, tmp_path / "reg") as server:
        server.publish_dir(bundle.path)
        monkeypatch.setenv("OSCAR_ZOO_ENDPOINT", server.url)
        monkeypatch.setenv("OSCAR_ZOO_SOURCES", "registry")
        first = pull("qwen3-8b", fmt="sglang")
        mods, proc = imported_modules("pull", "qwen3-8b", "-q")
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert str(first.export.files["k"]) in proc.stdout
        assert not mods & set(WARM_FORBIDDEN + ("huggingface_hub",)), mods


def test_warm_layers_pull_is_light_and_rewrites_nothing(tmp_path, monkeypatch, hub):
    """A --layers part was checked when it was fetched: pulling it again parses no schema
    (pydantic) and writes no meta (an fsync per pull)."""
    from tests.utils.bundles import make_bundle
    from tests.utils.databases import fresh_database
    from tests.utils.registry_server import run_registry

    bundle = make_bundle(tmp_path / "b", model="qwen3-8b")
    with fresh_database("sqlite", tmp_path) as url, run_registry(url, tmp_path / "reg") as server:
        server.publish_dir(bundle.path)
        monkeypatch.setenv("OSCAR_ZOO_ENDPOINT", server.url)
        monkeypatch.setenv("OSCAR_ZOO_SOURCES", "registry")
        part = pull("qwen3-8b", layers="0-1", fmt="sglang")
        assert part.layers == [0, 1] and "partial" in part.path.parts
        meta = _meta_file()
        stamp = meta.stat().st_mtime_ns
        mods, proc = imported_modules("pull", "qwen3-8b", "--layers", "0-1", "-q")
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert str(part.export.files["k"]) in proc.stdout
        assert not mods & set(WARM_FORBIDDEN + ("huggingface_hub",)), mods
        assert meta.stat().st_mtime_ns == stamp


def _meta_file():
    from oscar_zoo.zoo.cache import Cache

    return next(Cache().root.glob("models/*/meta/*.json"))


@pytest.mark.parametrize("fmt", ["sglang", "vllm"])
def test_recipe_matches_the_bundle(seed_zoo, fmt):
    seed_zoo(("hf",))
    r = pull("glm-4.7-fp8", fmt=fmt)
    env, cmd = r.export.recipe.env, r.export.recipe.command
    prefix = "SGLANG_OSCAR" if fmt == "sglang" else "VLLM_OSCAR"
    assert env[f"{prefix}_K_ROTATION_PATH"] == str(r.export.files["k"])
    assert env[f"{prefix}_V_CLIP_RATIO"] == "0.92"
    if fmt == "sglang":
        assert cmd[cmd.index("--kv-cache-dtype") + 1] == "int2"
        assert env["SGLANG_MIXED_KV_PREFIX_TOKENS"] == "64" and env["SGLANG_MIXED_KV_SCALE_DTYPE"] == "float32"
    else:
        assert cmd[cmd.index("--kv-cache-dtype") + 1] == "oscar_int2"
        assert env["VLLM_OSCAR_GROUP_SIZE"] == "128" and "#46774" in r.export.recipe.notes[0]


def test_export_list_and_show_without_a_registry(seed_zoo, tmp_path):
    from click.testing import CliRunner

    from oscar_zoo.zoo.cli.main import cli

    seed_zoo(("hf",))
    runner = CliRunner()
    result = runner.invoke(cli, ["export", "glm-4.7-fp8", "--out", str(tmp_path / "x")])
    assert result.exit_code == 1 and "not in the cache" in result.stderr  # export never downloads
    pull("glm-4.7-fp8")
    result = runner.invoke(cli, ["export", "glm-4.7-fp8", "--format", "vllm", "--layers", "46-91",
                                 "--out", str(tmp_path / "x")])
    assert result.exit_code == 0, result.output
    assert "VLLM_OSCAR_K_ROTATION_PATH=" + str(tmp_path / "x") in result.stdout
    assert "# note: vLLM's OSCAR backend is an open, work-in-progress PR" in result.stdout  # as pull
    torch = pytest.importorskip("torch")
    k = torch.load(tmp_path / "x" / "k_rotation_qqt_r_h_pbr.pt", weights_only=True)
    assert sorted(k["layers"]) == list(range(46, 92))
    rows = {r["name"]: r for r in __import__("json").loads(runner.invoke(cli, ["list", "--json"]).stdout)}
    assert rows["glm-4.7-fp8"]["cached"] == ["rotationzoo"] and "rotationzoo" in rows["qwen3-8b"]["sources"]
    assert "smollm2-135m" not in rows  # no rotations anywhere for the test model
    assert runner.invoke(cli, ["list", "--validated", "--json"]).stdout.strip() == "[]"
    text = runner.invoke(cli, ["show", "qwen3-30b-a3b"]).stdout
    assert "per KV head" in text and "48 of 48 layers" in text
    assert "2 GPUs" in text and "Lloyd-Max" not in text
    lloyd = runner.invoke(cli, ["show", "minimax-m2.7", "--json"]).stdout
    assert __import__("json").loads(lloyd)["catalog"]["serving"]["lloyd_max"] is True
    assert "recent 1024, Lloyd-Max buckets, 4 GPUs" in runner.invoke(cli, ["show", "minimax-m2.7"]).stdout
    bad = runner.invoke(cli, ["show", "qwen3-8bb"])
    assert bad.exit_code == 1 and "Did you mean: qwen3-8b" in bad.stderr


@pytest.mark.parametrize("spec", ["", "²", "3-²", "0,,2"])
def test_export_refuses_a_layer_spec_it_cannot_read(tmp_path, spec):
    """'' used to export every layer (pull refused it), '²' passed str.isdigit and died in int()."""
    from click.testing import CliRunner

    from oscar_zoo.zoo.cli.main import cli
    from tests.utils.bundles import make_bundle

    bundle = make_bundle(tmp_path / "b", model="qwen3-8b")
    r = CliRunner().invoke(cli, ["export", str(bundle.path), "--layers", spec, "--out", str(tmp_path / "o")])
    assert r.exit_code == 1 and "bad --layers" in r.stderr, r.output
    assert not (tmp_path / "o").exists()


def test_export_out_is_all_new_files_or_all_old_ones(tmp_path, monkeypatch):
    """Re-exporting another bundle into the same --out and failing (or being killed) after the
    first file used to leave the new K beside the old V: both complete, the pair wrong."""
    import shutil

    from click.testing import CliRunner

    from oscar_zoo.zoo.cli.main import cli
    from tests.utils.bundles import make_bundle

    out = tmp_path / "rotations"
    old, new = (make_bundle(tmp_path / f"b{i}", model="qwen3-8b", seed=i) for i in (0, 1))
    assert CliRunner().invoke(cli, ["export", str(old.path), "--out", str(out)]).exit_code == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real_copy, calls = shutil.copyfileobj, []

    def copy_then_fail_on_the_second_file(fin, fout, *args):
        calls.append(1)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real_copy(fin, fout, *args)

    monkeypatch.setattr(shutil, "copyfileobj", copy_then_fail_on_the_second_file)
    r = CliRunner().invoke(cli, ["export", str(new.path), "--out", str(out)])
    assert r.exit_code != 0 and len(calls) == 2
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # no temp file left either


@pytest.mark.parametrize("spec, first", [(None, -1), ("0-45", 0), ("10-12", 10), ("3_5", 3),
                                         ("12-13_20", 12), ("0-91.46.0123abcd", 0)])
def test_cache_ls_orders_parts_by_their_first_layer_in_every_spelling(spec, first):
    """layer_spec writes 3_5 and 12-13_20 for lists with gaps; those sorted as whole bundles."""
    from oscar_zoo.zoo.cli.client_cmds import _first_layer

    assert _first_layer(spec) == first
