"""Engine files from a cached bundle: SGLang/vLLM `.pt` checkpoints, or the bundle itself.

    safetensors  the canonical bundle (bundle.json, rotations.safetensors, README.md)
    sglang       OSCAR checkpoints with OSCAR's names (oscar-spec 1.6): format 1 per layer, 2 per
                 KV head, 3 when keys are centered; read by SGLANG_OSCAR_{K,V}_ROTATION_PATH
    vllm         the same per-layer checkpoints, for vLLM's oscar_int2 backend (no per-head yet)

Exports are built once per (digest, format, layers) under <cache>/exports/ and reused, so a warm
`pull --format sglang` only reads a small JSON file and stats the files it lists (export.json
records their sizes: they are written without fsync, so a crash may leave one short, and such an
export is built again). export.json also records each file's sha256, which `oscar-zoo verify`
checks: a same-size corruption is not something the warm path looks for. It also records the
WRITER that built it, so an export made by an oscar-zoo whose files differ (a fixed checkpoint
writer, new names) is built again instead of served from the cache. Written without torch
(zoo/interop/pt_writer.py).
`--out DIR` copies the files there.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from .cache import Cache, absolute
from .errors import Conflict, InvalidInput, is_no_space
from .files import (PARTIAL, atomic_write_bytes, atomic_writers, out_dir_out_of_space,
                    publish_dir, sha256_file, staging_dir)
from .recipes import Recipe, recipe_for

FORMATS = ("safetensors", "sglang", "vllm")
INFO = "export.json"
# Bump whenever the same bundle would export to different files (writer, names, recipe inputs):
# cached exports of another writer are then stale. None: exports from before it was recorded.
# 2: a --layers output exported without --layers had been cached as its whole bundle's export.
WRITER = 2


@dataclass
class ExportResult:
    format: str
    dir: Path                       # absolute, as are the files
    files: dict[str, Path]          # role (k, v, bundle.json, ...) -> path
    recipe: Recipe | None
    layers: list[int] | None

    def to_dict(self) -> dict:
        return {"format": self.format, "dir": str(self.dir),
                "files": {k: str(v) for k, v in self.files.items()},
                "layers": self.layers, "recipe": self.recipe.to_dict() if self.recipe else None}


def layer_spec(layers: list[int] | None) -> str | None:
    """File-name-safe spelling of a layer list, one per list: 0-45, 0-1_3, 0-10_20-30. It names
    cache dirs, so two lists must never share one; past 100 characters a hash keeps it short."""
    if not layers:
        return None
    runs, start = [], layers[0]
    for prev, cur in zip(layers, layers[1:] + [None]):
        if cur != prev + 1:
            runs.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = cur
    spec = "_".join(runs)
    if len(spec) > 100:
        digest = hashlib.sha256(",".join(map(str, layers)).encode()).hexdigest()[:16]
        spec = f"{layers[0]}-{layers[-1]}.{len(layers)}.{digest}"
    return spec


def export(cache: Cache, digest: str, bundle_dir: Path, fmt: str, layers: list[int] | None = None,
           out: Path | None = None) -> ExportResult:
    """Engine files for the bundle in `bundle_dir` (a snapshot or a --layers partial).

    Raises InvalidInput for an unknown format, vLLM with per-head rotations, or layers that a
    --layers output does not hold; StorageFull when the cache's disk or --out's is full.
    """
    manifest = json.loads((bundle_dir / "bundle.json").read_text())
    check_format(fmt, manifest["method"]["granularity"])
    layers = _held_layers(bundle_dir, layers)
    if fmt == "safetensors" and not layers:
        files = {f: bundle_dir / f for f in _bundle_files(manifest)}
        edir = bundle_dir
    else:
        edir = cache.export_dir(digest, fmt, layer_spec(layers))
        info = _intact(edir, layers)
        if info is None:
            with cache.out_of_space(f"building the {fmt} export"), \
                    cache.lock(f"export-{digest}-{fmt}-{layer_spec(layers)}", f"the {fmt} export"):
                info = _intact(edir, layers)
                if info is None:
                    info = _build(bundle_dir, fmt, layers, edir)
        files = {role: edir / name for role, name in info["files"].items()}
    if out is not None:
        _refuse_foreign_files(files, Path(out))   # before anything is written there
        with out_dir_out_of_space(out, "copying the engine files there"):
            files = _copy_out(files, Path(out))
            _mark_out(Path(out), digest, fmt, layers, files)
        edir = Path(out)
    # absolute: the recipe and --json are saved and used from elsewhere (a launch script, a
    # systemd unit, another tool's working directory)
    files = {role: absolute(p) for role, p in files.items()}
    recipe = recipe_for(fmt, manifest, {role: str(p) for role, p in files.items()}, layers)
    return ExportResult(fmt, absolute(edir), files, recipe, layers)


def check_format(fmt: str, granularity: str | None) -> None:
    """Whether `fmt` can carry rotations of this granularity (layer | kv_head; None: not known
    yet, only the format name is checked). Raises InvalidInput.

    The one statement of the rule: export() applies it to the cached bundle, and pull applies it
    as soon as the manifest (or, for RotationZoo files, the catalog) tells the granularity, so a
    pull that cannot be served stops before any rotation is downloaded.
    """
    if fmt not in FORMATS:
        raise InvalidInput(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if fmt == "vllm" and granularity == "kv_head":
        raise InvalidInput(
            "vLLM's OSCAR backend (vllm-project/vllm#46774) loads one [head_dim, head_dim] rotation "
            "per layer; this bundle has one per KV head, and sharing one would collapse the model "
            "(OSCAR #16). Use --format sglang.")


def _held_layers(bundle_dir: Path, layers: list[int] | None) -> list[int] | None:
    """The layers to export: `layers`, or for a --layers output (partial.json) the ones it holds.

    A part shares its whole bundle's digest, so exported as if whole it was cached as the whole
    bundle's export and served for it: SGLang then stopped on the first layer it missed."""
    if not (bundle_dir / PARTIAL).is_file():
        return layers
    from .bundle import part_of     # here: numpy and pydantic would make every warm pull slow

    part = part_of(bundle_dir)
    held = sorted(part["layers"])
    if layers is None:
        return held
    missing = sorted(set(layers) - set(held))
    if missing:
        raise InvalidInput(f"{bundle_dir} is a --layers output holding layers {layers_arg(held)} "
                           f"only, not {layers_arg(missing)}: pass --layers within those, or "
                           "export from the whole bundle")
    return layers


def layers_arg(layers: list[int]) -> str:
    """A layer list as --layers takes it: 0-3,7."""
    return layer_spec(layers).replace("_", ",")


def _bundle_files(manifest: dict) -> list[str]:
    return ["bundle.json"] + [f["name"] for f in manifest.get("files", [])]


def _load(bundle_dir: Path, layers: list[int] | None):
    from .bundle import read

    bundle = read(bundle_dir, verify=False)  # verified when it entered the cache
    if layers:
        missing = sorted(set(layers) - set(bundle.k))
        if missing:
            raise InvalidInput(f"the cached bundle has no layers {missing[:8]}")
        bundle.k = {i: bundle.k[i] for i in layers}
        bundle.v = {i: bundle.v[i] for i in layers}
    return bundle


def _intact(edir: Path, layers: list[int] | None) -> dict | None:
    """export.json of an export of these layers whose files are all there at their recorded
    sizes, else None.

    Stat only, no hashing: this is the warm path. The files were written without fsync, so
    after a crash one may be short or missing; an export.json from before sizes and checksums
    were recorded cannot tell, and counts as stale too."""
    info = _info(edir)
    if info is None or info["layers"] != layers:  # a dir named by an older, ambiguous layer_spec
        return None
    if info.get("writer") != WRITER:
        return None
    try:
        if any((edir / name).stat().st_size != size for name, size in info["sizes"].items()):
            return None
    except OSError:
        return None
    return info


def _info(edir: Path) -> dict | None:
    """The export.json in `edir` if it lists, for each of its files, a size and a sha256."""
    try:
        info = json.loads((edir / INFO).read_text())
        names = set(info["files"].values())
        if "layers" not in info or not (set(info["sizes"]) == set(info["sha256"]) == names):
            return None
        if any("/" in n or "\\" in n or n in ("", ".", "..") for n in names):
            return None  # edited to point outside its directory: not ours to read
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # a torn or edited one too
        return None
    return info


def verify_export(edir: Path) -> tuple[int, list[tuple[str, str]]] | None:
    """Re-hash an export's files against its export.json: (files checked, [(file, problem)]).
    None for one that cannot vouch for itself (a torn export.json, or one from an oscar-zoo that
    recorded no checksums): the next pull or export builds it again anyway."""
    info = _info(edir)
    if info is None:
        return None
    problems = []
    for name, want in sorted(info["sha256"].items()):
        try:
            got = sha256_file(edir / name)
        except FileNotFoundError:
            problems.append((name, "missing"))
            continue
        if got != want:
            problems.append((name, f"sha256 {got[:12]}... should be {want[:12]}..."))
    return len(info["sha256"]), problems


def _build(bundle_dir: Path, fmt: str, layers: list[int] | None, edir: Path) -> dict:
    """Write the export to a staging dir and publish it at `edir` (over a stale one); returns
    its export.json."""
    bundle = _load(bundle_dir, layers)
    with staging_dir(edir) as tmp:
        if fmt == "safetensors":
            files = _write_partial_bundle(bundle_dir, bundle, tmp)
        else:
            from .interop.convert import oscar_files, oscar_names
            from .interop.oscar_pt import write_file

            k_name, v_name = oscar_names(bundle.manifest)
            k, v = oscar_files(bundle)
            # rebuildable from the snapshot at any time: no fsync (it dominated a cold pull)
            write_file(tmp / k_name, k, durable=False)
            write_file(tmp / v_name, v, durable=False)
            files = {"k": k_name, "v": v_name}
        names = files.values()
        info = {"format": fmt, "writer": WRITER, "layers": layers, "files": files,
                "sizes": {name: (tmp / name).stat().st_size for name in names},
                "sha256": {name: sha256_file(tmp / name) for name in names}}
        atomic_write_bytes(tmp / INFO, json.dumps(info, indent=2).encode() + b"\n")
        edir.parent.mkdir(parents=True, exist_ok=True)
        publish_dir(tmp, edir, overwrite=edir.exists())
    return info


def _write_partial_bundle(bundle_dir: Path, bundle, tmp: Path) -> dict[str, str]:
    """bundle.json and README.md as they are, plus a rotations.safetensors of the chosen layers
    (it no longer matches the manifest's sha256: partial.json says what it holds)."""
    from safetensors.numpy import save

    # serialized here and written by our writer, as bundle.write does: save_file's own write
    # reports a full disk as a SafetensorError, not an OSError, so no out_of_space told it
    layers = ",".join(map(str, bundle.layers))
    tensors = save(bundle.to_tensors(), metadata={"format": "oscar-zoo.bundle", "layers": layers})
    atomic_write_bytes(tmp / "rotations.safetensors", tensors)
    shutil.copyfile(bundle_dir / "bundle.json", tmp / "bundle.json")
    files = {"bundle.json": "bundle.json", "rotations.safetensors": "rotations.safetensors"}
    if (bundle_dir / "README.md").is_file():  # a registry --layers part comes without one
        shutil.copyfile(bundle_dir / "README.md", tmp / "README.md")
        files["README.md"] = "README.md"
    partial = {"layers": bundle.layers, "rotations.safetensors": sha256_file(tmp / "rotations.safetensors")}
    atomic_write_bytes(tmp / PARTIAL, json.dumps(partial, indent=2).encode() + b"\n")
    return {**files, PARTIAL: PARTIAL}


OUT_MARK = ".oscar-zoo.json"


def _marked(out: Path) -> dict[str, str]:
    """{file name: sha256} of what an earlier export wrote to `out` (its OUT_MARK); {} if none."""
    try:
        files = json.loads((out / OUT_MARK).read_text()).get("files", {})
    except (OSError, ValueError, AttributeError):
        return {}
    return files if isinstance(files, dict) else {}


def _refuse_foreign_files(files: dict[str, Path], out: Path) -> None:
    """Raise Conflict, writing nothing, when --out holds a file of a name this export writes that
    oscar-zoo did not put there: a RotationZoo checkout uses OSCAR's very names
    (k_rotation_qqt_r_h_pbr.pt), and replacing the user's own without a word loses it. What an
    earlier export left, unchanged since (its OUT_MARK says), may be replaced; so may a file
    that already holds exactly the bytes about to be written."""
    ours = _marked(out)
    in_the_way = []
    for src in files.values():
        dest = out / src.name
        if not (dest.is_file() or dest.is_symlink()):
            continue   # nothing there; a directory in the way has its own error (_copy_out)
        sha = sha256_file(dest) if dest.is_file() else None
        if sha is not None and (ours.get(dest.name) == sha or sha == sha256_file(src)):
            continue
        why = " (changed since oscar-zoo wrote it)" if dest.name in ours else ""
        in_the_way.append(f"{dest.name}{why}")
    if in_the_way:
        raise Conflict(f"--out {out} already holds {', '.join(in_the_way)}, which oscar-zoo did "
                       "not write there (its .oscar-zoo.json lists what it wrote); nothing was "
                       "written. To fix: choose another --out, or move or remove "
                       f"{'that file' if len(in_the_way) == 1 else 'those files'} if they may "
                       "be replaced")


def _mark_out(out: Path, digest: str, fmt: str, layers: list[int] | None,
              files: dict[str, Path]) -> None:
    """Say what --out holds (digest, format, layers, files), and remove what an earlier export
    there wrote that this one did not replace, if it is unchanged since: a directory pulled
    into again holds one version's files, not a per-head K of v3 beside the V of v4."""
    mark = out / OUT_MARK
    before = _marked(out)
    now = {p.name: sha256_file(p) for p in files.values()}
    for name, sha in before.items():
        stale = out / os.path.basename(name)    # never a path out of --out, whatever the mark says
        if name not in now and stale.is_file() and sha256_file(stale) == sha:
            stale.unlink()
    atomic_write_bytes(mark, json.dumps({"digest": digest, "format": fmt, "layers": layers,
                                         "files": now}, indent=2).encode() + b"\n")


def _copy_out(files: dict[str, Path], out: Path) -> dict[str, Path]:
    """Copy (following the cache's links) into a user directory, all files or none."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # a file in the way, no permission: say which --out, not a traceback
        if is_no_space(e):
            raise       # no path problem: export() says the disk is full
        raise InvalidInput(f"--out {out}: cannot create that directory ({e.strerror}); choose "
                           "another path") from None
    copied = {role: out / src.name for role, src in files.items()}
    # a failure leaves `out` as it was, never a new K beside an old V
    try:
        with atomic_writers(list(copied.values())) as outs:
            for src, fout in zip(files.values(), outs):
                with open(src, "rb") as fin:
                    shutil.copyfileobj(fin, fout, 1 << 20)
    except IsADirectoryError as e:
        raise InvalidInput(f"--out {out}: {e.filename} is a directory; move it or choose another "
                           "path") from None
    return copied
