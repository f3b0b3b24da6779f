"""The cache under stress: concurrent pulls in separate processes, dead lock holders, live
ones (timeout), offline mode, `verify` finding corruption, `prune` keeping what refs use."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from oscar_zoo.zoo.cache import Cache, prune, verify_cache
from oscar_zoo.zoo.cli.main import cli
from oscar_zoo.zoo.errors import LockTimeout, OfflineError
from oscar_zoo.zoo.export import WRITER
from oscar_zoo.zoo.pull import pull

from .conftest import (GLM_FILES, GLM_FOLDER, HF_ZOO, oscar_pt, paused_export_build,
                       pull_paused_after)

OSCAR_ZOO = [sys.executable, "-m", "oscar_zoo.zoo.cli.main"]
# what verify re-hashes: a bundle's bundle.json, rotations.safetensors and README.md, and with an
# sglang export (the CLI's default) its K and V files
BUNDLE_FILES = 3
PULLED_FILES = BUNDLE_FILES + 2


def test_two_concurrent_pulls_share_one_download(hf_only, hub):
    """Ollama #200: two terminals pulling at once corrupted each other. Here both succeed, the
    files are fetched once, and the cache verifies."""
    # slow the transfer down so the two processes really overlap
    hub.truncate(GLM_FILES[0], after=3_000_000, stall=1.0, times=1)
    procs = [subprocess.Popen(OSCAR_ZOO + ["pull", "glm-4.7-fp8", "--json", "-q"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=os.environ.copy())
             for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1].decode()[-2000:] for o in outs]
    digests = {json.loads(o[0])["digest"] for o in outs}
    assert len(digests) == 1
    full_gets = [p for p in hub.requests("GET", GLM_FILES[0])]
    assert len(full_gets) - len([r for r in hub.ranges if GLM_FILES[0] in r[0]]) == 1
    checked, problems = verify_cache(Cache())
    assert checked == PULLED_FILES and problems == []


def _hold_lock(key: str, ready: str) -> subprocess.Popen:
    code = (f"from oscar_zoo.zoo.cache import Cache\nimport time\n"
            f"with Cache().lock({key!r}):\n    open({ready!r}, 'w').close()\n    time.sleep(60)\n")
    return subprocess.Popen([sys.executable, "-c", code], env=os.environ.copy())


def _wait_for(path: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 30
    while not os.path.exists(path):
        assert proc.poll() is None and time.monotonic() < deadline, "lock holder did not start"
        time.sleep(0.05)


def _blob_key(zoo_files) -> str:
    import hashlib

    return "blob-" + hashlib.sha256(zoo_files[f"{GLM_FOLDER}/{GLM_FILES[0]}"]).hexdigest()


def test_a_lock_left_by_a_killed_process_does_not_block(hf_only, zoo_files, tmp_path, monkeypatch):
    """HF #2543: a lock from an interrupted run made later runs wait forever."""
    monkeypatch.setenv("OSCAR_ZOO_LOCK_TIMEOUT", "20")
    ready = str(tmp_path / "ready")
    holder = _hold_lock(_blob_key(zoo_files), ready)
    _wait_for(ready, holder)
    os.kill(holder.pid, signal.SIGKILL)  # dies holding the lock, like a crashed pull
    holder.wait()
    assert (Cache().root / ".locks" / f"{_blob_key(zoo_files)}.lock").exists()
    t0 = time.monotonic()
    assert pull("glm-4.7-fp8").source == "hf"
    assert time.monotonic() - t0 < 15


def test_a_live_holder_times_out_with_a_clear_error(hf_only, zoo_files, tmp_path, monkeypatch):
    monkeypatch.setenv("OSCAR_ZOO_LOCK_TIMEOUT", "0.5")
    ready = str(tmp_path / "ready")
    holder = _hold_lock(_blob_key(zoo_files), ready)
    try:
        _wait_for(ready, holder)
        with pytest.raises(LockTimeout, match=f"pid {holder.pid}.*OSCAR_ZOO_LOCK_TIMEOUT"):
            pull("glm-4.7-fp8")
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize("switch", ["OSCAR_ZOO_OFFLINE", "HF_HUB_OFFLINE"])
def test_offline_serves_the_cache_without_any_request(hf_only, hub, monkeypatch, switch):
    first = pull("glm-4.7-fp8", fmt="sglang")
    hub.log.clear()
    monkeypatch.setenv(switch, "1")
    again = pull("glm-4.7-fp8", fmt="sglang")
    assert again.digest == first.digest and again.export.files == first.export.files
    assert hub.log == []
    with pytest.raises(OfflineError, match="qwen3-30b-a3b is not cached at all"):
        pull("qwen3-30b-a3b")
    with pytest.raises(OfflineError, match="glm-4.7-fp8@2 is not in the cache.*rotationzoo"):
        pull("glm-4.7-fp8@2")
    assert hub.log == []


def test_verify_finds_a_corrupt_blob_and_the_next_pull_repairs_it(hf_only):
    r = pull("glm-4.7-fp8")
    meta = json.loads((r.path.parents[1] / "meta" / f"{r.digest}.json").read_text())
    blob = Cache().blob(meta["files"]["rotations.safetensors"])
    os.chmod(blob, 0o644)
    with open(blob, "r+b") as f:  # bit rot
        f.seek(1000)
        byte = f.read(1)
        f.seek(1000)
        f.write(bytes([byte[0] ^ 1]))
    result = CliRunner().invoke(cli, ["verify", "glm-4.7-fp8"])
    assert result.exit_code == 1
    assert "CORRUPT glm-4.7-fp8" in result.stdout and "rotations.safetensors" in result.stdout
    assert not blob.exists() and not r.path.exists()  # removed, so the next pull refetches
    again = pull("glm-4.7-fp8")  # re-converted from the kept .pt blobs: same digest
    assert again.digest == r.digest and again.path.exists()
    result = CliRunner().invoke(cli, ["verify"])
    assert result.exit_code == 0 and "all checksums match" in result.stdout
    result = CliRunner().invoke(cli, ["verify", "glm-4.7-fp9"])  # a typo checks nothing: not a pass
    assert result.exit_code == 1 and "neither a bundle directory nor a model in the cache" in result.stderr


def test_verify_a_bundle_directory(hf_only, tmp_path):
    r = pull("glm-4.7-fp8", fmt="safetensors", out=tmp_path / "b")
    assert CliRunner().invoke(cli, ["verify", str(tmp_path / "b")]).exit_code == 0
    (tmp_path / "b" / "README.md").write_text("edited\n")
    result = CliRunner().invoke(cli, ["verify", str(tmp_path / "b")])
    assert result.exit_code == 1 and "README.md" in result.stderr
    assert r.digest


def test_an_export_left_short_by_a_crash_is_built_again(hf_only, tmp_path):
    """Exports are written without fsync: after a crash a file can be short or missing while
    export.json says the export is done."""
    first = pull("glm-4.7-fp8", fmt="sglang")
    k, v = first.export.files["k"], first.export.files["v"]
    whole = {f: f.read_bytes() for f in (k, v)}
    info = first.export.dir / "export.json"
    assert json.loads(info.read_text())["sizes"] == {f.name: len(b) for f, b in whole.items()}
    os.truncate(k, len(whole[k]) // 2)
    v.unlink()
    again = pull("glm-4.7-fp8", fmt="sglang")
    assert again.export.files == first.export.files and again.cached
    assert {f: f.read_bytes() for f in (k, v)} == whole
    # an export.json from before sizes (or checksums, or the writer) were recorded cannot vouch
    # for its files, nor can one another writer made: built again
    for key in ("sizes", "sha256", "writer", "another writer"):
        old = json.loads(info.read_text())
        if key == "another writer":
            old["writer"] = -1
        else:
            del old[key]
        info.write_text(json.dumps(old))
        os.truncate(k, 0)
        out = tmp_path / f"out-{key}"
        result = CliRunner().invoke(cli, ["export", "glm-4.7-fp8", "--out", str(out)])
        assert result.exit_code == 0, result.output
        assert (out / k.name).read_bytes() == k.read_bytes() == whole[k]
        rebuilt = json.loads(info.read_text())
        assert {"sizes", "sha256"} <= set(rebuilt) and rebuilt["writer"] == WRITER


def test_verify_finds_a_corrupt_export_and_the_next_pull_builds_it_again(hf_only):
    """The warm path only stats an export (sizes): a flipped byte is verify's to find."""
    first = pull("glm-4.7-fp8", fmt="sglang")
    k = first.export.files["k"]
    whole = k.read_bytes()
    with open(k, "r+b") as f:
        f.seek(len(whole) // 2)
        f.write(bytes([whole[len(whole) // 2] ^ 0x10]))
    assert pull("glm-4.7-fp8", fmt="sglang").export.files["k"].read_bytes() != whole  # served
    result = CliRunner().invoke(cli, ["verify", "glm-4.7-fp8", "--json"])
    assert result.exit_code == 1
    problems = json.loads(result.stdout)["problems"]
    assert [(p["file"], p["problem"][:6]) for p in problems] == [(f"exports/sglang/{k.name}", "sha256")]
    assert not first.export.dir.exists() and first.path.exists()  # the export only: the bundle is fine
    again = pull("glm-4.7-fp8", fmt="sglang")
    assert again.export.files["k"] == k and k.read_bytes() == whole
    assert verify_cache(Cache()) == (PULLED_FILES, [])


def test_verify_checks_exports_of_bundle_directories_too(tmp_path):
    """`export DIR` builds its files in the cache (exports/<sha256 of bundle.json>), which no
    snapshot holds: verify skipped them and said "all checksums match" over a flipped byte that
    the next export then copied out."""
    from oscar_zoo.zoo.cache import DIR_EXPORT
    from tests.utils.bundles import make_bundle

    bundle = make_bundle(tmp_path / "b", model="qwen3-8b")
    args = ["export", str(bundle.path), "--format", "sglang", "--out", str(tmp_path / "out"), "--json"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    out_k = Path(json.loads(result.stdout)["files"]["k"])
    whole = out_k.read_bytes()
    built = next(Cache().root.glob(f"exports/*/sglang/{out_k.name}"))
    with open(built, "r+b") as f:                    # the same size: the warm path's check passes
        f.seek(len(whole) // 2)
        f.write(bytes([whole[len(whole) // 2] ^ 0x10]))
    result = CliRunner().invoke(cli, ["verify", "--json"])
    assert result.exit_code == 1, result.output
    problems = json.loads(result.stdout)["problems"]
    assert [(p["model"], p["file"], p["problem"][:6]) for p in problems] == [
        (DIR_EXPORT, f"exports/sglang/{out_k.name}", "sha256")]
    assert not built.exists()
    result = CliRunner().invoke(cli, ["verify"])
    assert result.exit_code == 0 and "all checksums match" in result.stdout, result.output
    assert CliRunner().invoke(cli, args).exit_code == 0 and out_k.read_bytes() == whole


def test_prune_drops_only_what_no_ref_uses(hf_only, hub):
    old = pull("glm-4.7-fp8", fmt="sglang")
    # the zoo entry is re-calibrated upstream: new files, new digest, the ref moves
    hub.seed("hf", HF_ZOO, {f"{GLM_FOLDER}/{GLM_FILES[0]}": oscar_pt("qqt_r_h_pbr", "layer", 1, 92, 128, None, 9)})
    new = pull("glm-4.7-fp8", fmt="sglang")
    assert new.digest != old.digest
    cache = Cache()
    dry = prune(cache, dry_run=True)
    assert old.path.exists() and dry
    # what it frees, by the disk's own count: each inode once, and only one all of whose links
    # go (a snapshot's files are hard links to its blobs, some of them shared with the new one)
    links: dict = {}
    for path, _ in dry:
        for f in [path] if path.is_file() else [f for f in path.rglob("*") if f.is_file()]:
            st = f.lstat()
            seen = links.setdefault((st.st_dev, st.st_ino), [0, st.st_nlink, st.st_size])
            seen[0] += 1
    freed = sum(size for count, nlink, size in links.values() if count == nlink)
    assert sum(n for _, n in dry) == freed < sum(size for _, _, size in links.values())
    removed = {p for p, _ in prune(cache)}
    assert old.path in removed and not old.path.exists()
    assert new.path.exists() and new.export.files["k"].exists()
    assert not old.export.dir.exists()
    assert verify_cache(cache) == (PULLED_FILES, [])
    assert prune(cache) == []
    v_blob = json.loads((new.path.parents[1] / "meta" / f"{new.digest}.json").read_text())["origin_files"]
    assert all(cache.has_blob(sha) for sha in v_blob.values())  # the zoo's .pt files are kept


def test_prune_and_ls_pass_over_what_a_file_manager_leaves_among_the_models(hf_only):
    """A .DS_Store (or any hidden entry) in models/ is not a model: prune used to stop on it."""
    pulled = pull("glm-4.7-fp8")
    cache = Cache()
    (cache.root / "models" / ".DS_Store").write_bytes(b"\0")
    (cache.root / "models" / ".Trash-1000").mkdir()
    # a copy made by hand under a name no model has: prune, ls and rm stopped on it
    odd = cache.root / "models" / "glm-4.7-fp8..old"
    shutil.copytree(cache.model_dir("glm-4.7-fp8"), odd)
    assert prune(cache) == []
    assert pulled.path.exists() and (cache.root / "models" / ".DS_Store").exists()
    r = CliRunner().invoke(cli, ["cache", "ls", "--json"])
    assert r.exit_code == 0 and "glm-4.7-fp8" in r.output and "..old" not in r.output
    r = CliRunner().invoke(cli, ["cache", "rm", "glm-4.7-fp8", "--yes"])
    assert r.exit_code == 0, r.output
    assert not pulled.path.exists() and (odd / "refs").is_dir()


def test_prune_ages_out_what_a_killed_download_left_in_the_blob_store():
    """<key>.hub is ModelScope's workdir (it resumes from a file inside), <key>.hub.done its
    finished file before we adopt it (zoo/sources/hubs.py): a process killed in between left
    the .hub.done behind for good."""
    cache = Cache()
    cache.ensure()
    old = time.time() - 2 * 3600
    stale = [_leftover(cache, "1", ".hub.done", old), _leftover(cache, "2", ".hub.done", old, tree=True),
             _leftover(cache, "3", ".hub", old, tree=True), _leftover(cache, "4", ".incomplete", old)]
    fresh = [_leftover(cache, "5", ".hub.done"), _leftover(cache, "6", ".hub", tree=True)]
    # made two hours ago, but its download (a few folders down) is still being written
    active = _leftover(cache, "7", ".hub", old, tree=True)
    os.utime(active / "Qwen3-30B-A3B" / "k_rotation_perhead.pt.incomplete", None)
    assert {p for p, _ in prune(cache)} == set(stale)
    assert not any(p.exists() for p in stale) and all(p.exists() for p in fresh + [active])


def test_prune_ages_out_staging_dirs_and_spares_a_pull_in_progress(hf_only):
    """A staging dir (.NAME.*.partial) beside a snapshot is a pull building it right now, or one
    killed before its finally ran: prune must not take the first for an orphan snapshot, and
    must not leave the second behind for good."""
    result = pull("glm-4.7-fp8", fmt="sglang")
    cache = Cache()
    old = time.time() - 2 * 3600
    spots = [result.path.parent, result.export.dir.parent,
             cache.model_dir("glm-4.7-fp8") / "partial" / result.digest]
    stale, fresh = [], []
    for i, spot in enumerate(spots):
        for tag, bucket, mtime in (("old", stale, old), ("new", fresh, None)):
            d = spot / f".{'a' * 64 if i == 0 else 'sglang'}.{tag}{i}.partial"
            (d / "inner").mkdir(parents=True)
            (d / "inner" / "rotations.safetensors").write_bytes(b"x" * 10)
            if mtime is not None:
                for p in (d / "inner" / "rotations.safetensors", d / "inner", d):
                    os.utime(p, (mtime, mtime))
            bucket.append(d)
    assert {p for p, _ in prune(cache)} == set(stale)
    assert not any(p.exists() for p in stale) and all(p.exists() for p in fresh)
    assert result.path.exists() and result.export.files["k"].exists()


def test_prune_waits_for_a_pull_whose_refs_are_not_written_yet(hf_only, monkeypatch):
    """Until its refs exist, a pull's new blobs and snapshot are garbage to prune: a prune run
    in that window removed the snapshot the pull then returned."""
    monkeypatch.setenv("OSCAR_ZOO_LOCK_TIMEOUT", "30")
    pruned: list = []
    pruner = threading.Thread(target=lambda: pruned.extend(prune(Cache())))
    real_write_ref = Cache.write_ref

    def write_ref_after_a_prune_started(self, name, ref, digest):
        if not pruner.is_alive() and not pruned:
            assert self.snapshot(name, digest) and not self.refs(name)
            pruner.start()
            time.sleep(0.5)
            assert pruner.is_alive()  # waiting for this pull
        real_write_ref(self, name, ref, digest)

    monkeypatch.setattr(Cache, "write_ref", write_ref_after_a_prune_started)
    result = pull("glm-4.7-fp8")
    pruner.join(timeout=30)
    assert not pruner.is_alive() and pruned == []
    assert verify_cache(Cache()) == (BUNDLE_FILES, []) and (result.path / "bundle.json").is_file()


def test_prune_times_out_naming_the_pull_it_waits_for(hf_only, monkeypatch):
    monkeypatch.setenv("OSCAR_ZOO_LOCK_TIMEOUT", "0.3")
    cache = Cache()
    cache.ensure()
    with cache.gc_guard():
        with pytest.raises(LockTimeout, match="a pull is still running.*OSCAR_ZOO_LOCK_TIMEOUT"):
            prune(cache)


def test_prune_gets_in_between_pulls_that_keep_overlapping(monkeypatch):
    """Pulls share the gc lock: a stream of them, each starting before the last one ends,
    held it without a break, and prune waited out its timeout. Threads stand in for the pull
    processes (each holder has its own open file, so flock treats them alike)."""
    monkeypatch.setenv("OSCAR_ZOO_LOCK_TIMEOUT", "5")
    cache = Cache()
    cache.ensure()
    stop, entered, errors = threading.Event(), [], []

    def pulls():
        while not stop.is_set():
            try:
                with cache.gc_guard():
                    entered.append(time.monotonic())
                    time.sleep(0.2)
            except LockTimeout as e:   # waiting for the prune past 5 s would be a bug too
                errors.append(e)

    streams = [threading.Thread(target=pulls) for _ in range(2)]
    for t in streams:
        t.start()
        time.sleep(0.1)    # staggered: one always holds the lock
    try:
        began = time.monotonic()
        prune(cache)
        took = time.monotonic() - began
        time.sleep(0.3)
    finally:
        stop.set()
        for t in streams:
            t.join(timeout=10)
    assert took < 2 and not errors
    assert any(t > began + took for t in entered)    # and the pulls went on after it


def test_pull_and_prune_on_a_filesystem_without_flock(hf_only, hub, monkeypatch):
    """Some network filesystems answer flock with ENOSYS: the cache then falls back to soft
    lock files (filelock's), and pull and prune still work. Mocked: no such filesystem here."""
    import errno
    import fcntl

    def no_flock(fd, how):
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    old = pull("glm-4.7-fp8")
    hub.seed("hf", HF_ZOO, {f"{GLM_FOLDER}/{GLM_FILES[0]}": oscar_pt("qqt_r_h_pbr", "layer", 1, 92, 128, None, 9)})
    new = pull("glm-4.7-fp8")
    assert old.path in {p for p, _ in prune(Cache())}
    assert not old.path.exists() and verify_cache(Cache()) == (BUNDLE_FILES, []) and new.path.exists()


def test_prune_removes_no_more_than_the_user_confirmed(hf_only, monkeypatch):
    cache = Cache()
    cache.ensure()
    old = time.time() - 2 * 3600
    listed = _leftover(cache, "1", ".incomplete", old)
    late = []

    def confirm_while_a_download_dies(*args, **kwargs):
        late.append(_leftover(cache, "2", ".incomplete", old))  # garbage the user never saw
        return True

    monkeypatch.setattr(click, "confirm", confirm_while_a_download_dies)
    result = CliRunner().invoke(cli, ["prune", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["removed"] == [str(listed)]
    assert not listed.exists() and late[0].exists()


def test_a_ref_write_killed_before_its_rename_is_no_ref(hf_only):
    """atomic_write_bytes leaves refs/.NAME.*.tmp when killed between fsync and rename: that
    file used to count as a ref, keeping its digest from prune for good."""
    result = pull("glm-4.7-fp8")
    cache = Cache()
    refs_dir = cache.model_dir("glm-4.7-fp8") / "refs"
    (refs_dir / ".latest.x1y2.tmp").write_text("a" * 64 + "\n")
    assert "a" * 64 not in cache.refs("glm-4.7-fp8").values()
    assert set(cache.refs("glm-4.7-fp8").values()) == {result.digest}


def test_a_folder_or_a_binary_file_in_refs_is_no_ref_and_breaks_no_listing(hf_only):
    """A hand-made HF-style refs/pr/1 folder, or a ref file holding binary garbage, stopped
    `cache ls` and `cache rm` with "Is a directory" / a decode error."""
    result = pull("glm-4.7-fp8")
    cache = Cache()
    refs_dir = cache.model_dir("glm-4.7-fp8") / "refs"
    (refs_dir / "pr").mkdir()
    (refs_dir / "pr" / "1").write_text("b" * 64 + "\n")
    (refs_dir / "junk").write_bytes(b"\xff\xfe" * 40)
    assert cache.refs("glm-4.7-fp8") == {"rotationzoo": result.digest}
    listed = CliRunner().invoke(cli, ["cache", "ls", "--json"])
    assert listed.exit_code == 0, listed.output
    assert json.loads(listed.stdout)["bundles"][0]["refs"] == ["rotationzoo"]
    removed = CliRunner().invoke(cli, ["cache", "rm", "glm-4.7-fp8", "--yes"])
    assert removed.exit_code == 0, removed.output
    assert not cache.snapshot("glm-4.7-fp8", result.digest)


def _leftover(cache: Cache, key: str, suffix: str, mtime: float | None = None, tree: bool = False):
    """blobs/<key * 64><suffix>: a file, or a tree like ModelScope's workdir; every mtime set."""
    path = cache.blobs / f"{key * 64}{suffix}"
    inner = path / "Qwen3-30B-A3B" / "k_rotation_perhead.pt.incomplete" if tree else path
    inner.parent.mkdir(parents=True, exist_ok=True)
    inner.write_bytes(b"x" * 100)
    if mtime is not None:
        for p in (inner, inner.parent, path) if tree else (path,):
            os.utime(p, (mtime, mtime))
    return path


def test_cache_ls_and_login(hf_only, sandbox):
    pull("glm-4.7-fp8")
    data = json.loads(CliRunner().invoke(cli, ["cache", "ls", "--json"]).stdout)
    assert [b["model"] for b in data["bundles"]] == ["glm-4.7-fp8"]
    assert data["bundles"][0]["refs"] == ["rotationzoo"] and data["bundles"][0]["source"] == "hf"
    secret = "ozk_" + "s" * 43      # shaped as registry tokens are: login refuses others
    result = CliRunner().invoke(cli, ["login", "--token", secret])
    assert result.exit_code == 0 and secret not in result.output
    token = sandbox / "config" / "token"
    assert token.read_text().strip() == secret
    assert oct(token.stat().st_mode & 0o777) == "0o600"


def test_a_pull_holds_off_prune_and_cache_rm_while_it_builds_its_export(hf_only, monkeypatch):
    """The snapshot an export reads stays until the export is built: a `cache rm` (or a prune
    after another pull moved the ref) waits for it instead of deleting the files under it."""
    from oscar_zoo.zoo.cache_remove import remove, resolve_removal

    pull("glm-4.7-fp8")
    monkeypatch.setenv("OSCAR_ZOO_LOCK_TIMEOUT", "0.5")
    building, release = paused_export_build(monkeypatch)
    seen = {}
    puller = threading.Thread(target=lambda: seen.update(r=pull("glm-4.7-fp8", fmt="sglang")))
    puller.start()
    try:
        assert building.wait(20)
        cache = Cache()
        with pytest.raises(LockTimeout, match="a pull is still running"):
            remove(cache, resolve_removal(cache, ["glm-4.7-fp8"]))
    finally:
        release.set()
        puller.join(30)
    assert seen["r"].export.files["k"].exists() and seen["r"].path.exists()


@pytest.mark.parametrize("mode, step", [("online", "_pull_online"), ("offline", "from_cache")])
def test_cache_rm_cannot_get_in_between_a_pulls_download_and_its_export(hf_only, monkeypatch,
                                                                      mode, step):
    """pull took the gc lock for the download and again for the export: a `cache rm` (or a
    prune) in between removed the snapshot, and the export then failed on a missing
    bundle.json. Paused right after the bundle is in the cache (`step` returned), the pull
    still holds prune and cache rm off until its export is built."""
    from oscar_zoo.zoo.cache_remove import remove, resolve_removal

    pull("glm-4.7-fp8")
    if mode == "offline":
        monkeypatch.setenv("OSCAR_ZOO_OFFLINE", "1")
    monkeypatch.setenv("OSCAR_ZOO_LOCK_TIMEOUT", "0.5")
    cache = Cache()
    with pull_paused_after(monkeypatch, step, "glm-4.7-fp8", fmt="sglang") as seen:
        with pytest.raises(LockTimeout, match="a pull is still running"):
            remove(cache, resolve_removal(cache, ["glm-4.7-fp8"]))
        with pytest.raises(LockTimeout, match="a pull is still running"):
            prune(cache)
    assert seen["r"].path.exists() and seen["r"].export.files["k"].exists()
    assert remove(cache, resolve_removal(cache, ["glm-4.7-fp8"])).failed == []   # now it goes


def test_prune_json_has_the_same_keys_with_nothing_to_prune():
    """`prune --json` left out dry_run when there was nothing to remove: a script reading it
    failed on a clean cache only."""
    cache = Cache()
    for dry in (False, True):
        result = CliRunner().invoke(cli, ["prune", "--json", "--yes"] + (["--dry-run"] if dry else []))
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout) == {"removed": [], "bytes": 0, "dry_run": dry}
    stale = _leftover(cache, "1", ".incomplete", time.time() - 7200)
    result = CliRunner().invoke(cli, ["prune", "--json", "--dry-run"])
    assert json.loads(result.stdout).keys() == {"removed", "bytes", "dry_run"} and stale.exists()


def test_a_relative_cache_dir_hands_out_absolute_paths(tmp_path, monkeypatch):
    """OSCAR_ZOO_CACHE=rel/cache: pull --json's path (and ls's) were relative to wherever the
    command ran, useless to the script that reads them from elsewhere."""
    from oscar_zoo.zoo.cache import Cache

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OSCAR_ZOO_CACHE", "rel/cache")
    root = Cache().root
    assert root.is_absolute() and root == tmp_path / "rel" / "cache"
