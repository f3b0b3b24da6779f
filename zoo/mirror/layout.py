"""What a mirrored version looks like in a hub repo (the same on the HF Hub and ModelScope).

    README.md                                 every model and version, with validation numbers
    oscar-zoo.json                            the index: model -> version -> folder, digest, tag
    <Model>/seq<T>_prompt<N>_group<G>/        the RotationZoo layout (oscar-spec 2.12), so
        k_rotation_qqt_r_h_pbr.pt             existing SGLang/vLLM scripts find the files
        v_rotation_sst_r_h_pbr.pt             (k_rotation_perhead.pt ... for per-head bundles)
        bundle.json, rotations.safetensors    our canonical bundle beside them
        README.md                             its model card

One commit per mirrored version, tagged `<model>-v<N>`; the folder on the main branch holds
the newest version mirrored to it, older ones stay reachable by their tags. A yank takes its
version off the main branch (engine scripts fetch folders from main and never read the index):
the folder gets back the newest version of it that is not yanked (`main_holder`), or is emptied
when none is left; the yanked version's tag keeps its files. Everything here is deterministic
(no timestamps), so mirroring the same version twice produces the same bytes and the hub sees
nothing to commit.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

INDEX = "oscar-zoo.json"
ROOT_README = "README.md"
_TAG = re.compile(r"seq\d+_prompt\d+_group\d+")


@dataclass(frozen=True)
class RepoFile:
    path: str                 # path in the hub repo
    data: bytes
    sha256: str
    git_sha1: str

    @classmethod
    def of(cls, path: str, data: bytes) -> "RepoFile":
        return cls(path, data, hashlib.sha256(data).hexdigest(),
                   hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest())


def tag_name(model: str, number: int) -> str:
    """Hub tag of a mirrored version: `glm-4.7-fp8-v3` (hub ids become org--name)."""
    return f"{model.replace('/', '--')}-v{number}"


def model_folder(manifest: dict) -> str:
    """The RotationZoo's own folder name for catalog models (GLM-4.7-FP8, Gemma4-12B), else the
    hub id's repo part."""
    from ..catalog import find

    entry = find(manifest["model"]["name"]) or find(manifest["model"]["hub_id"])
    if entry is not None and entry.zoo is not None:
        return entry.zoo.folder.split("/")[0]
    return manifest["model"]["hub_id"].split("/")[-1]


def calibration_tag(manifest: dict) -> str:
    """seq<T>_prompt<N>_group<G>: tokens, prompts and INT2 group size, as OSCAR names them; an
    imported bundle keeps the tag of the folder it came from."""
    cal, group = manifest["calibration"], manifest["quantization"]["group_size"]
    found = _TAG.search(cal.get("imported_from") or "")
    if found:
        return found.group(0)
    return f"seq{cal.get('tokens') or 0}_prompt{cal.get('prompts') or 0}_group{group}"


def version_folder(manifest: dict) -> str:
    return f"{model_folder(manifest)}/{calibration_tag(manifest)}"


def version_files(bundle_dir: Path, manifest: dict, folder: str) -> list[RepoFile]:
    """The folder's files: the bundle as it is, plus OSCAR .pt files exported from it."""
    from ..bundle import read
    from ..files import safe_join
    from ..interop.convert import oscar_files, oscar_names
    from ..interop.oscar_pt import oscar_dict
    from ..interop.pt_writer import dumps

    names = ["bundle.json"] + [f["name"] for f in manifest["files"]]
    out = [RepoFile.of(f"{folder}/{n}", safe_join(bundle_dir, n).read_bytes()) for n in names]
    bundle = read(bundle_dir, verify=False)  # verified when it was published
    k, v = oscar_files(bundle)
    for name, f in zip(oscar_names(bundle.manifest), (k, v)):
        out.append(RepoFile.of(f"{folder}/{name}", dumps(oscar_dict(f), name[:-3])))
    return out


def index_entry(manifest: dict, digest: str, number: int, files: list[RepoFile], folder: str,
                model: str | None = None) -> dict:
    """`model`: the registry's name of the model (default: bundle.json's)."""
    validation = manifest.get("validation") or {}
    variants = {v["name"]: v for v in validation.get("variants", [])}
    return {
        "version": number, "digest": digest, "path": folder,
        "tag": tag_name(model or manifest["model"]["name"], number),
        "source": manifest["calibration"]["source"],
        "imported_from": manifest["calibration"].get("imported_from"),
        "granularity": manifest["method"]["granularity"],
        "validated": validation.get("passed") if validation else None,
        "delta_nll": variants.get("bundle", {}).get("delta_nll"),
        "delta_nll_hadamard": variants.get("hadamard", {}).get("delta_nll"),
        "context_len": validation.get("context_len"),
        "created_at": manifest["calibration"].get("created_at"),
        "files": {f.path.rsplit("/", 1)[1]: f.sha256 for f in files},
        "yanked": False, "yank_reason": None,
    }


class UnreadableIndex(ValueError):
    """The hub's index is not JSON with a `models` object; rebuilding it would drop every
    other entry, so it is never rewritten without a person looking at it."""


def load_index(current: bytes | None) -> dict:
    """The index as read from the hub (a new one when there is none). Raises UnreadableIndex."""
    if current is None:
        return {"format": "oscar-zoo.mirror", "format_version": 1, "models": {}}
    try:
        loaded = json.loads(current)
    except ValueError as e:
        raise UnreadableIndex(f"it is not JSON ({e})") from None
    if not isinstance(loaded, dict) or not isinstance(loaded.get("models"), dict):
        raise UnreadableIndex("it has no `models` object")
    return loaded


def updated_index(current: bytes | None, manifest: dict, entry: dict,
                  model: str | None = None) -> dict:
    """The index with `entry` added under `model` (default: bundle.json's name). Raises
    UnreadableIndex rather than rebuild an index it cannot read (that would drop the rest)."""
    index = load_index(current)
    name = model or manifest["model"]["name"]
    slot = index["models"].get(name)
    if not readable_slot(slot):   # hand-edited on the hub: this model's entry starts over
        slot = index["models"][name] = {"versions": {}}
    slot["hub_id"] = manifest["model"]["hub_id"]
    slot["versions"][str(entry["version"])] = entry
    slot["latest"] = latest_version(slot["versions"])
    return index


def mark_yanked(index: dict, model: str, number: int, reason: str) -> dict | None:
    """Record a yank in the index; returns the version's entry, None when the index does not
    hold it. `latest` moves to the newest version that is not yanked (None if all are)."""
    slot = (index.get("models") or {}).get(model)
    entry = slot["versions"].get(str(number)) if readable_slot(slot) else None
    if entry is None:
        return None
    entry["yanked"], entry["yank_reason"] = True, reason
    slot["latest"] = latest_version(slot["versions"])
    return entry


def latest_version(versions: dict) -> int | None:
    """The newest version not yanked: what a bare pull from the mirror gets."""
    live = [int(n) for n, e in versions.items() if isinstance(e, dict) and not e.get("yanked")]
    return max(live, default=None)


def last_mirrored_into(versions: dict, folder: str) -> str | None:
    """The version last mirrored into `folder` on the main branch: the newest recorded in it
    (an older one mirrored after it went to a v<N> subfolder, runner._folder_for)."""
    return max((n for n, e in versions.items() if e.get("path") == folder), key=int,
               default=None)


def main_holder(versions: dict, folder: str) -> str | None:
    """The version whose files `folder` on the main branch holds: the one last mirrored into
    it, or once that one is yanked, the newest version not yanked that belongs there (recorded
    in it or in one of its v<N> subfolders; never another calibration's, whose folder name
    would then lie about seq/prompt/group). None: the yank emptied the folder."""
    top = last_mirrored_into(versions, folder)
    if top is None or not versions[top].get("yanked"):
        return top
    return replacement(versions, folder)


def replacement(versions: dict, folder: str) -> str | None:
    """The newest version not yanked that belongs in `folder` (recorded in it or in one of its
    v<N> subfolders) and says where its files are: what the folder holds once the version last
    mirrored into it is yanked; None when there is none."""
    live = [n for n, e in versions.items()
            if not e.get("yanked") and _belongs(e.get("path"), folder) and _restorable(e)]
    return max(live, key=int, default=None)


def folders_of(path) -> list[str]:
    """The main-branch folders a version recorded at `path` may be served from: its own, and
    for a v<N> subfolder the folder above it (where a yank of a newer version restores it)."""
    if not isinstance(path, str):
        return []
    parent = path.rpartition("/")[0]
    return [path, parent] if parent and _belongs(path, parent) else [path]


def _belongs(path, folder: str) -> bool:
    return path == folder or (isinstance(path, str) and path.startswith(folder + "/v")
                              and path[len(folder) + 2:].isdigit())


def _restorable(entry: dict) -> bool:
    """Whether an entry says where its files are (tag, folder, names): every entry oscar-zoo
    writes does; one edited by hand that does not cannot be put back on main."""
    return isinstance(entry.get("tag"), str) and isinstance(entry.get("path"), str) \
        and isinstance(entry.get("files"), dict) and bool(entry["files"])


def readable_slot(slot) -> bool:
    """A model's entry in the index as oscar-zoo writes it: {versions: {number: entry}}."""
    versions = slot.get("versions") if isinstance(slot, dict) else None
    return isinstance(versions, dict) and all(str(n).isdigit() and isinstance(e, dict)
                                              for n, e in versions.items())


def dump_index(index: dict) -> bytes:
    return json.dumps(index, indent=2, sort_keys=True).encode() + b"\n"


def render_root_readme(index: dict, repo: str, kind: str = "hf") -> bytes:
    """The repo's landing page: how to get a version from this hub (`kind`: hf or modelscope),
    and one row per mirrored version, newest first per model."""
    lines = [
        "---", "library_name: oscar-zoo", "license: apache-2.0",
        "tags: [oscar, kv-cache, int2, kv-cache-quantization, rotation]", "---", "",
        "# OSCAR rotation bundles",
        "",
        "Orthogonal rotations and clip thresholds for serving LLMs with a 2-bit KV cache "
        "(OSCAR, arXiv 2605.17757), mirrored by oscar-zoo. Each folder follows the RotationZoo "
        "layout (`<Model>/seq<T>_prompt<N>_group<G>/` with `k_rotation_*.pt` and "
        "`v_rotation_*.pt`), next to the canonical bundle (`bundle.json`, "
        "`rotations.safetensors`) and its model card. Every version is also a tag, "
        "`<model>-v<N>`; the folder on the main branch holds the newest that is not yanked "
        "(a yanked version is reachable by its tag only), and an older version mirrored after "
        "it sits in a `v<N>/` subfolder of it.",
        "",
        "```bash",
        *_get_it(repo, kind),
        "```",
        "",
        "| model | version | folder | tag | source | validated | extra loss vs BF16 (nats/token) | Hadamard baseline |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in sorted(index["models"]):
        slot = index["models"][name]
        if not readable_slot(slot):   # another tool's entry: not ours to describe
            continue
        for number in sorted(slot["versions"], key=int, reverse=True):
            lines.append(_readme_row(name, number, slot["versions"]))
    return ("\n".join(lines) + "\n").encode()


def _get_it(repo: str, kind: str) -> list[str]:
    """The landing page's commands, in this hub's own tools: oscar-zoo with this repo as its
    pull source, and the hub's CLI fetching one version by its tag and folder."""
    if kind == "modelscope":
        pull = f"OSCAR_ZOO_MODELSCOPE_MIRROR_REPO={repo} oscar-zoo pull <model>"
        get = (f"modelscope download --model {repo} --revision <tag> {version_patterns()} "
               "--local_dir <dir>")
        hub = "ModelScope"
    else:
        pull = f"OSCAR_ZOO_HF_MIRROR_REPO={repo} oscar-zoo pull <model>"
        get = f"hf download {repo} --revision <tag> {version_patterns()} --local-dir <dir>"
        hub = "the Hugging Face Hub"
    return [f"# with oscar-zoo, this repo on {hub} as a pull source:", pull,
            "# or one version's files, by its tag and folder (columns below):", get]


def version_patterns(folder: str = "<folder>") -> str:
    """--include/--exclude selecting exactly the files of the version in `folder`. Both hubs'
    CLIs match them with fnmatch, whose `*` crosses `/`: `<folder>/*` alone also takes the
    older versions kept in its v<N>/ subfolders. The exclude matches only paths below such a
    subfolder; a version's own files lie directly in its folder."""
    return f"--include '{folder}/*' --exclude '{folder}/v[0-9]*/*'"


def _readme_row(name: str, number: str, versions: dict) -> str:
    # .get throughout: an entry written by hand or by another tool may lack any field, and
    # one such entry must not stop every later mirror to the repo
    e = versions[number]
    val = {True: "passed", False: "failed"}.get(e.get("validated"), "-")
    shown = f"{number} (yanked)" if e.get("yanked") else number
    folder = f"`{e.get('path', '-')}`"
    if e.get("yanked") and isinstance(e.get("path"), str) \
            and main_holder(versions, e["path"]) is None:
        folder += " (removed from main: no version left there that is not yanked)"
    return (f"| {name} | {shown} | {folder} | `{e.get('tag', '-')}` | "
            f"{e.get('source', '-')} | {val} | {_num(e.get('delta_nll'))} | "
            f"{_num(e.get('delta_nll_hadamard'))} |")


def _num(x) -> str:
    return f"{x:+.4f}" if isinstance(x, (int, float)) and not isinstance(x, bool) else "-"
