"""The client path stays light: `--help`, a cold hub pull and a warm pull never import torch or
triton, and the warm pull imports no numpy, safetensors or pydantic either (measured with
`python -X importtime` in a fresh process, the way a user runs it)."""

from __future__ import annotations

import errno
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


def test_warm_registry_pull_is_light(registry_with_qwen):
    first = pull("qwen3-8b", fmt="sglang")
    mods, proc = imported_modules("pull", "qwen3-8b", "-q")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert str(first.export.files["k"]) in proc.stdout
    assert not mods & set(WARM_FORBIDDEN + ("huggingface_hub",)), mods


def test_warm_layers_pull_is_light_and_rewrites_nothing(registry_with_qwen):
    """A --layers part was checked when it was fetched: pulling it again parses no schema
    (pydantic) and writes no meta (an fsync per pull)."""
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
    assert result.exit_code == 1 and "not cached at all" in result.stderr  # export never downloads
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


def test_list_without_a_registry_says_what_it_shows(seed_zoo, monkeypatch):
    """`list 'qwen3-*' --validated` with no OSCAR_ZOO_ENDPOINT said only "no models match":
    validation reports come from the registry, so nothing could."""
    from click.testing import CliRunner

    from oscar_zoo.zoo.cli.main import cli

    seed_zoo(("hf",))
    runner = CliRunner()
    out = runner.invoke(cli, ["list", "qwen3-*", "--validated"])
    assert out.exit_code == 0 and out.stdout.strip() == "no models match"
    assert "no registry configured" in out.stderr and "OSCAR_ZOO_ENDPOINT" in out.stderr
    assert "--validated" in out.stderr and "RotationZoo" in out.stderr
    assert runner.invoke(cli, ["list", "qwen3-*", "--validated", "--json"]).stdout.strip() == "[]"
    listed = runner.invoke(cli, ["list", "qwen3-*"])      # rows: no note to read past
    assert "qwen3-8b" in listed.stdout and listed.stderr == ""
    nothing = runner.invoke(cli, ["list", "nosuch-*"])
    assert "no registry configured" in nothing.stderr and "--validated" not in nothing.stderr
    monkeypatch.setenv("OSCAR_ZOO_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("OSCAR_ZOO_OFFLINE", "1")
    offline = runner.invoke(cli, ["list", "qwen3-*", "--validated"])
    assert "offline" in offline.stderr and "no registry configured" not in offline.stderr


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


# --- a full disk ---------------------------------------------------------------------------------
# Simulated (tests/utils/full_disk.py: a real full disk cannot be made in a test run in general),
# except in the last test, which mounts a tiny tmpfs where a user namespace allows it.

def _cache_leftovers(root) -> list[str]:
    """What a failed pull left in the cache besides its locks and CACHEDIR.TAG: only whole,
    verified blobs may stay (each named by its own sha256)."""
    import hashlib

    left = []
    for p in sorted(root.rglob("*")):
        if p.is_dir() or ".locks" in p.parts or p.name == "CACHEDIR.TAG":
            continue
        if p.parent.name == "sha256" and hashlib.sha256(p.read_bytes()).hexdigest() == p.name:
            continue
        left.append(str(p.relative_to(root)))
    return left


def _one_error_line(result, *says: str) -> str:
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert result.stdout == ""                       # data on stdout only: there is none
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert "Traceback" not in result.stderr
    for text in says:
        assert text in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def registry_with_qwen(tmp_path, monkeypatch, hub):
    """A registry holding a qwen3-8b bundle (a 4.7 MB rotations file), the only source."""
    from tests.utils.bundles import make_bundle
    from tests.utils.databases import fresh_database
    from tests.utils.registry_server import run_registry

    bundle = make_bundle(tmp_path / "b", model="qwen3-8b")
    with fresh_database("sqlite", tmp_path) as url, run_registry(url, tmp_path / "reg") as server:
        server.publish_dir(bundle.path)
        monkeypatch.setenv("OSCAR_ZOO_ENDPOINT", server.url)
        monkeypatch.setenv("OSCAR_ZOO_SOURCES", "registry")
        yield server


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
def test_a_pull_into_a_full_cache_says_how_to_make_room_and_keeps_nothing_half_written(
        registry_with_qwen, cache_root, monkeypatch, code):
    """The cache's disk filling up mid-download ended in "[Errno 28] No space left on device"
    naming no directory and no way out, and left the partial download (4.7 MB, kept for a resume
    that cannot fit) where prune spares it for an hour."""
    from click.testing import CliRunner

    from oscar_zoo.zoo.cli.main import cli
    from tests.utils.full_disk import full_disk

    with full_disk(monkeypatch, cache_root, free=100_000, code=code) as disk:
        result = CliRunner().invoke(cli, ["pull", "qwen3-8b", "-q"])
    assert disk.refused                 # the rotations file, partway (and what came after)
    _one_error_line(result, f"out of disk space in the oscar-zoo cache {cache_root} "
                    f"({os.strerror(code)}) while pulling qwen3-8b;", "nothing half-written",
                    "`oscar-zoo prune`", "`oscar-zoo cache rm NAME`", "OSCAR_ZOO_CACHE")
    assert _cache_leftovers(cache_root) == []
    assert not (cache_root / "models" / "qwen3-8b" / "snapshots").exists()
    # room made: the same pull goes through
    again = CliRunner().invoke(cli, ["pull", "qwen3-8b", "-q"])
    assert again.exit_code == 0, again.output
    assert "SGLANG_OSCAR_K_ROTATION_PATH" in again.stdout


@pytest.mark.parametrize("fills", ["cache", "out"])
def test_an_export_onto_a_full_disk_names_the_directory_and_keeps_nothing_half_written(
        tmp_path, cache_root, monkeypatch, fills):
    """The export is built in the cache, then copied to --out: either disk may be the full one,
    and the error says which, and what to do about it."""
    from click.testing import CliRunner

    from oscar_zoo.zoo.cli.main import cli
    from tests.utils.bundles import make_bundle
    from tests.utils.full_disk import full_disk

    bundle = make_bundle(tmp_path / "b", model="qwen3-8b")
    out = tmp_path / "rotations"
    with full_disk(monkeypatch, cache_root if fills == "cache" else out, free=10_000):
        result = CliRunner().invoke(cli, ["export", str(bundle.path), "--out", str(out)])
    if fills == "cache":
        _one_error_line(result, f"out of disk space in the oscar-zoo cache {cache_root} (No space "
                        "left on device) while building the sglang export;", "`oscar-zoo prune`",
                        "OSCAR_ZOO_CACHE")
        assert [p for p in cache_root.rglob("*") if p.is_file() and ".locks" not in p.parts
                and p.name != "CACHEDIR.TAG"] == []
    else:
        _one_error_line(result, f"out of disk space in --out {out} (No space left on device) while "
                        "copying the engine files there;", "choose another --out")
    assert not out.exists() or list(out.iterdir()) == []


@pytest.mark.parametrize("direction", ["--from", "--to"])
def test_a_convert_onto_a_full_out_names_it_and_the_fix_there(tmp_path, monkeypatch, direction):
    """`convert ... --out DIR` onto a full disk said "[Errno 28] ... (free space on that disk
    (`oscar-zoo prune` removes what no ref uses from the cache)...)": neither --out nor a fix
    that frees room there."""
    from click.testing import CliRunner

    from oscar_zoo.zoo.bundle import read
    from oscar_zoo.zoo.cli.main import cli
    from oscar_zoo.zoo.interop.convert import export_files
    from tests.utils.bundles import make_bundle
    from tests.utils.full_disk import full_disk

    bundle = make_bundle(tmp_path / "b", model="qwen3-8b")
    disk = tmp_path / "disk"
    disk.mkdir()
    out = disk / "out"
    if direction == "--from":
        k, v = export_files(read(bundle.path), tmp_path / "sglang")
        args, doing = ["--from", "sglang", str(k), str(v), "--model", "qwen3-8b"], "writing the bundle"
    else:
        args, doing = ["--to", "sglang", str(bundle.path)], "copying the engine files there"
    with full_disk(monkeypatch, disk, free=10_000):   # the bundle's staging dir is beside --out
        result = CliRunner().invoke(cli, ["convert", *args, "--out", str(out)])
    line = _one_error_line(result, f"out of disk space in --out {out} (No space left on device) "
                           f"while {doing}; nothing half-written was kept. To fix: free "
                           "space on that disk, or choose another --out")
    assert "prune" not in line
    assert not out.exists() or list(out.iterdir()) == []
    assert list(p for p in disk.iterdir() if p != out) == []


def test_a_pull_onto_a_real_full_disk(registry_with_qwen, tmp_path):
    """The simulation's premise checked on a real filesystem: a 64 KB tmpfs as the cache, in a
    user namespace of its own (skipped where the kernel or the container refuses one)."""
    from tests.utils.full_disk import run_on_a_tiny_tmpfs

    cache, listing = tmp_path / "cache", tmp_path / "left.txt"
    proc = run_on_a_tiny_tmpfs(cache, f'"{sys.executable}" -m oscar_zoo.zoo.cli.main pull '
                               f'qwen3-8b -q; rc=$?; find "{cache}" -type f > "{listing}"; exit $rc',
                               {**os.environ, "OSCAR_ZOO_CACHE": str(cache)})
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith(f"Error: out of disk space in the oscar-zoo cache {cache} (No "
                               "space left on device) while pulling qwen3-8b;"), lines[0]
    left = listing.read_text().split()
    assert not [f for f in left if f.endswith((".incomplete", ".tmp"))], left
    assert not [f for f in left if "/models/" in f], left


def test_a_layers_safetensors_export_onto_a_real_full_disk(tmp_path):
    """`export --format safetensors --layers` wrote its rotations with safetensors' save_file,
    whose full disk is a SafetensorError, not an OSError: a traceback, not the one line that
    names the cache. On a real disk (a 64 KB tmpfs as the cache, in a user namespace), as
    tests/utils/full_disk.py cannot simulate it: it fails Python's writes, and save_file
    writes from Rust."""
    from tests.utils.bundles import make_bundle

    from tests.utils.full_disk import run_on_a_tiny_tmpfs

    bundle = make_bundle(tmp_path / "b", model="qwen3-8b")    # layers 0-3: 512 KB of rotations
    cache, out, listing = tmp_path / "cache", tmp_path / "out", tmp_path / "left.txt"
    proc = run_on_a_tiny_tmpfs(cache, f'"{sys.executable}" -m oscar_zoo.zoo.cli.main export '
                               f'"{bundle.path}" --format safetensors --layers 0-3 --out "{out}"; '
                               f'rc=$?; find "{cache}" -type f > "{listing}"; exit $rc',
                               {**os.environ, "OSCAR_ZOO_CACHE": str(cache)})
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith(f"Error: out of disk space in the oscar-zoo cache {cache} (No "
                               "space left on device) while building the safetensors export;"), \
        lines[0]
    assert "`oscar-zoo prune`" in lines[0]
    left = listing.read_text().split()
    assert not [f for f in left if "/.locks/" not in f and not f.endswith("CACHEDIR.TAG")], left
    assert not out.exists()


def test_any_other_write_onto_a_full_disk_says_to_free_space(monkeypatch):
    """Commands that do not name their directory (here `login`, storing the token) still answer
    a full disk with one line saying what to do, no traceback. Simulated at os.write, which
    store_token calls (a real full disk: see the test above)."""
    from click.testing import CliRunner

    from oscar_zoo.zoo.cli.main import cli

    def full_write(fd, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", full_write)
    result = CliRunner().invoke(cli, ["login", "--token", "ozk_" + "t" * 43])
    _one_error_line(result, "No space left on device", "free space on that disk",
                    "`oscar-zoo prune`")


@pytest.fixture
def registry_with_smol(tmp_path, monkeypatch, hub):
    """A registry holding smollm2-135m v1, published without a validation report; head_dim 64,
    so vLLM's prototype (head_dim 128, group 128) refuses it."""
    from tests.utils.bundles import make_bundle
    from tests.utils.databases import fresh_database
    from tests.utils.registry_server import run_registry

    bundle = make_bundle(tmp_path / "b", model="smollm2-135m")
    assert bundle.manifest.validation is None
    with fresh_database("sqlite", tmp_path) as url, run_registry(url, tmp_path / "reg") as server:
        server.publish_dir(bundle.path)
        monkeypatch.setenv("OSCAR_ZOO_ENDPOINT", server.url)
        monkeypatch.setenv("OSCAR_ZOO_SOURCES", "registry")
        yield server


REFUSAL = "The PR's prototype checks its settings and accepts only head_dim 128 with group size 128"


@pytest.mark.parametrize("quiet", [[], ["-q"]])
def test_pull_warns_on_stderr_of_what_the_engine_will_refuse(registry_with_smol, tmp_path, quiet):
    """`pull ... --format vllm > serve.sh` exited 0 with the only word of vLLM refusing the
    bundle in a `# note:` line of serve.sh: with stdout redirected, the user saw nothing."""
    import json

    from click.testing import CliRunner

    from oscar_zoo.zoo.cli.main import cli

    out = tmp_path / "rotations"
    r = CliRunner().invoke(cli, ["pull", "smollm2-135m@1", "--format", "vllm", "--out", str(out),
                                 *quiet])
    assert r.exit_code == 0, r.output
    assert f"# note: {REFUSAL}" in r.stdout                 # the recipe keeps it
    warned = [line for line in r.stderr.splitlines() if line.startswith("warning: ")]
    assert any(REFUSAL in line for line in warned), r.stderr
    assert any("work-in-progress PR" in line for line in warned)   # every note of the recipe
    assert "warning" not in r.stdout
    data = json.loads(CliRunner().invoke(cli, ["pull", "smollm2-135m@1", "--format", "vllm",
                                               "--json"]).stdout)
    assert any(REFUSAL in n for n in data["export"]["recipe"]["notes"])   # and --json


def test_pull_says_a_version_was_never_validated(registry_with_smol):
    """The summary left its validation line out, which read as nothing to worry about."""
    from click.testing import CliRunner

    from oscar_zoo.zoo.cli.main import cli

    r = CliRunner().invoke(cli, ["pull", "smollm2-135m@1"])
    assert r.exit_code == 0, r.output
    assert ("  validation  none: the bundle holds no validation report"
            in r.stderr.splitlines()), r.stderr
    assert "validation" not in CliRunner().invoke(cli, ["pull", "smollm2-135m@1", "-q"]).stderr


def test_export_warns_on_stderr_of_what_the_engine_will_refuse(registry_with_smol, tmp_path):
    import json

    from click.testing import CliRunner

    from oscar_zoo.zoo.cli.main import cli

    pull("smollm2-135m@1")
    r = CliRunner().invoke(cli, ["export", "smollm2-135m@1", "--format", "vllm", "--out",
                                 str(tmp_path / "x")])
    assert r.exit_code == 0, r.output
    assert f"# note: {REFUSAL}" in r.stdout
    assert any(line.startswith("warning: ") and REFUSAL in line for line in r.stderr.splitlines())
    r = CliRunner().invoke(cli, ["export", "smollm2-135m@1", "--format", "vllm", "--out",
                                 str(tmp_path / "x"), "--json"])
    assert r.exit_code == 0 and any(REFUSAL in n for n in json.loads(r.stdout)["recipe"]["notes"])


@pytest.mark.parametrize("fmt", ["sglang", "safetensors"])
def test_export_prints_absolute_resolved_paths(tmp_path, monkeypatch, fmt):
    """`export b --out x --json` printed dir and files as given (relative, `..` and all), which
    mean nothing to the script or tool that reads them from another working directory."""
    import json
    from pathlib import Path

    from click.testing import CliRunner

    from oscar_zoo.zoo.cli.main import cli
    from tests.utils.bundles import make_bundle

    make_bundle(tmp_path / "b")
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    out = (tmp_path / "rotations").resolve()
    args = ["export", "../b", "--format", fmt, "--out", "../work/../rotations"]
    r = CliRunner().invoke(cli, args + ["--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["dir"] == str(out)
    assert data["files"] and all(p == str(out / Path(p).name) for p in data["files"].values())
    if fmt == "sglang":
        env = data["recipe"]["env"]
        assert (env["SGLANG_OSCAR_K_ROTATION_PATH"], env["SGLANG_OSCAR_V_ROTATION_PATH"]) == \
            (data["files"]["k"], data["files"]["v"])
    else:       # the human output of a bundle export is its directory
        assert CliRunner().invoke(cli, args).stdout.strip() == str(out)


def test_an_export_left_in_a_relative_cache_is_named_by_absolute_paths(tmp_path, monkeypatch):
    """Without --out (pull), the files stay in the cache, which OSCAR_ZOO_CACHE may name
    relative to the working directory."""
    from pathlib import Path

    from oscar_zoo.zoo.cache import Cache
    from oscar_zoo.zoo.export import export
    from oscar_zoo.zoo.files import sha256_file
    from tests.utils.bundles import make_bundle

    bundle = make_bundle(tmp_path / "b")
    monkeypatch.chdir(tmp_path)
    result = export(Cache("cache"), sha256_file(bundle.path / "bundle.json"), Path("b"), "sglang")
    assert result.dir.is_absolute() and result.dir.is_relative_to((tmp_path / "cache").resolve())
    d = result.to_dict()
    assert all(Path(p).is_absolute() and Path(p).parent == result.dir for p in d["files"].values())
    assert result.recipe.env["SGLANG_OSCAR_K_ROTATION_PATH"] == d["files"]["k"]
