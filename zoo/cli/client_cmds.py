"""The client commands: pull, list|ls, show|info, verify, prune, cache ls|rm, login, logout,
whoami, export, publish.

Data goes to stdout (a launch recipe that can be piped into a script, or JSON with --json);
progress, summaries and warnings go to stderr. Nothing here imports torch.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import click

from .output import emit, info, json_option, plural, warn, warn_unless_json

FORMAT_CHOICE = click.Choice(["safetensors", "sglang", "vllm"])


def _small_blas() -> None:
    """One BLAS thread for the client's small matrix checks (184 products of 128x128 in a
    GLM-4.7 bundle): on a busy machine, a thread pool per product costs 20x the math. Only
    effective before numpy is imported, which the CLI does not do at startup."""
    import os

    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")


def _alias(cmd: click.Command, name: str) -> click.Command:
    """A hidden second name for a command (`ls` for `list`)."""
    return click.Command(name, callback=cmd.callback, params=cmd.params, help=cmd.help,
                         hidden=True, context_settings=cmd.context_settings)


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


# --- pull --------------------------------------------------------------------------------------

@click.command("pull")
@click.argument("spec", metavar="NAME[@VERSION|@ALIAS]")
@click.option("--format", "fmt", type=FORMAT_CHOICE, default="sglang", show_default=True,
              help="Engine files to produce: OSCAR .pt files for SGLang or vLLM, or the "
                   "bundle itself (safetensors).")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              help="Copy the files here (default: they stay in the cache).")
@click.option("--layers", metavar="SPEC",
              help="Only these layers, e.g. 0-45 (a pipeline-parallel stage's share).")
@click.option("--source", "sources", multiple=True, type=click.Choice(["registry", "hf", "modelscope"]),
              help="Pull only from these sources (default: OSCAR_ZOO_SOURCES).")
@click.option("-q", "--quiet", is_flag=True, help="No progress or summary on stderr (warnings still).")
@json_option
def pull_command(spec, fmt, out, layers, sources, quiet, as_json):
    """Download, verify and cache a rotation bundle, then print how to serve with it.

    \b
    oscar-zoo pull glm-4.7-fp8                    # recommended version, SGLang files + flags
    oscar-zoo pull zai-org/GLM-4.7-FP8@3 --format vllm --out rotations/
    oscar-zoo pull glm-4.7-fp8 --layers 0-45      # one pipeline stage's layers
    oscar-zoo pull glm-4.7-fp8 > serve.sh         # stdout is the launch recipe
    """
    _small_blas()
    from ..pull import pull

    result = pull(spec, layers=layers, fmt=fmt, out=out, progress=not quiet,
                  sources=list(sources) or None)
    if as_json:     # it carries the notes, which of them are warnings, and the recipe's notes
        emit(result.to_dict(), True)
        return
    for note in result.notes:       # warnings even under -q: they are what -q must not hide
        if note.warning:
            warn(note.text)
        elif not quiet:
            info(f"note: {note.text}")
    for note in _recipe_notes(result.export):
        warn(note)
    if not quiet:
        for line in _summary(result):
            info(line)
    click.echo(_stdout(result))


def _summary(r) -> list[str]:
    what = f"{r.model} v{r.version}" if r.version is not None else r.model
    how = "from the cache" if r.cached else f"{_size(r.fetched_bytes)} downloaded"
    lines = [f"{what}: {'imported from' if r.imported else 'from'} {r.origin} ({how})",
             f"  digest      sha256:{r.digest}",
             f"  bundle      {r.path}"]
    if r.imported:
        lines.append("  validation  none: imported from the RotationZoo as shipped")
    elif r.validated is not None:
        lines.append(f"  validation  {'passed' if r.validated else 'FAILED'}")
    else:   # said, not left out: a missing line reads as nothing to worry about
        lines.append("  validation  none: the bundle holds no validation report")
    if r.export is not None:
        lines.append(f"  {r.export.format:<11} {r.export.dir}")
    return lines


def _stdout(r) -> str:
    exp = r.export
    if exp.recipe is None:
        return str(exp.dir)
    title = {"sglang": "SGLang", "vllm": "vLLM"}[exp.format]
    head = [f"# {title} launch recipe for {r.model}"
            + (f" v{r.version}" if r.version is not None else "") + f" (sha256:{r.digest[:12]})"]
    # `pull ... > serve.sh` must carry it: stderr is gone by the time someone runs the script
    head += [f"# WARNING: {n.text}" for n in r.notes if n.in_recipe]
    return "\n".join(head + [_recipe_text(exp)])


def _recipe_notes(exp) -> list[str]:
    """The recipe's notes (what the engine will refuse, ignore or need extra), to warn of on
    stderr too: `pull ... > serve.sh` puts the recipe, and its `# note:` lines, where the user
    does not look until the engine refuses to start."""
    return exp.recipe.notes if exp is not None and exp.recipe is not None else []


def _recipe_text(exp) -> str:
    """The launch lines after the recipe's notes: what an engine will refuse or needs extra."""
    if exp.recipe is None:
        return str(exp.dir)
    return "\n".join([f"# note: {n}" for n in exp.recipe.notes] + [exp.recipe.shell()])


# --- list, show ----------------------------------------------------------------------------------

@click.command("list")
@click.argument("pattern", required=False, metavar="[GLOB]")
@click.option("--validated", is_flag=True,
              help="Only models whose default version (recommended, else latest) passed validation.")
@json_option
def list_command(pattern, validated, as_json):
    """Models with rotations: the registry's (when configured) and the RotationZoo's.

    \b
    oscar-zoo list 'qwen3-*' --validated
    """
    from .. import settings
    from ..cache import Cache
    from ..catalog import listed
    from ..errors import OfflineError, RemoteError
    from ..registry_client import RegistryClient

    rows: dict[str, dict] = {}
    cache = Cache()
    client = RegistryClient()
    asked = client.configured and not settings.is_offline()
    if asked:
        try:
            rows = _registry_rows(client, pattern, validated)
        except (OfflineError, RemoteError) as e:  # the catalog and the cache still answer
            _without_registry(e, "this list holds only the RotationZoo's models and the local "
                                 "cache")
    for e in listed(pattern):
        row = rows.setdefault(e.name, {"name": e.name, "hub_id": e.hub_id, "latest": None,
                                       "recommended": None, "validated": None,
                                       "validated_version": None, "sources": [], "state": None})
        if e.zoo is not None:
            row["sources"].append("rotationzoo")
    for row in rows.values():
        row["cached"] = sorted(cache.refs(row["name"])) if cache.model_dir(row["name"]).exists() else []
    out = [r for r in rows.values() if not validated or r["validated"]]
    out = [r for r in out if r["sources"] or r["cached"]]
    if not asked and (validated or not out):
        info(_no_registry_note(client.configured, validated))
    emit(sorted(out, key=lambda r: r["name"]), as_json, _list_table)


def _no_registry_note(configured: bool, validated: bool) -> str:
    """Why a list without the registry is empty, or may be: validation reports (--validated)
    and the registry's own models come from it alone."""
    why = ("offline (OSCAR_ZOO_OFFLINE or HF_HUB_OFFLINE): the registry was not asked"
           if configured else "no registry configured: set OSCAR_ZOO_ENDPOINT (e.g. "
           "http://127.0.0.1:8000) to list its models")
    shown = "this list holds only the RotationZoo's models and the local cache"
    if validated:
        shown += ", and --validated keeps none of them (list takes validation from the registry)"
    return f"note: {why}; {shown}"


def _without_registry(e: Exception, shown: str) -> None:
    """Warn that the registry gave no answer, and what is shown without it; re-raise an answer
    that is the user's to see (a 4xx: a bad request, an endpoint that is no registry). No
    answer is a registry that cannot be reached, or one failing on its side (a 5xx, 429: a
    proxy in front of a registry that is down): errors.is_transient, the rule by which pull
    stands the cache in for the registry, with the status named as pull's warning names it."""
    from ..errors import is_transient

    if not is_transient(e):
        raise e
    status = getattr(e, "status", None)
    failed = f" (the registry failed on its side: HTTP {status})" if status is not None else ""
    warn(f"{e}{failed}; {shown}")


def _registry_rows(client, pattern: str | None, validated: bool) -> dict[str, dict]:
    rows = {}
    for m in client.models(q=pattern, published=validated):
        latest, recommended = m.get("latest_version"), m.get("recommended_version")
        rows[m["name"]] = {"name": m["name"], "hub_id": m["hub_id"], "latest": latest,
                           "recommended": recommended,
                           # the verdict is the registry's for the version a bare pull gets
                           # (queries.model_stats), not the latest's: say which one it is
                           "validated": m.get("validation_passed"),
                           "validated_version": recommended if recommended is not None else latest,
                           # a catalog model the registry holds no version of is not a source;
                           # one holding only drafts or yanked versions is, as the API and
                           # the UI list it (pull NAME@VERSION gets them)
                           "sources": ["registry"] if latest is not None
                           or m.get("versions_count") else [],
                           "state": "published" if latest is not None else None}
    unpublished = [row for row in rows.values() if row["sources"] and row["state"] is None]
    for i, row in enumerate(unpublished):
        # a read each, for a few; a registry where CI keeps a draft per model would make list
        # a request per model, each with its retries when the registry fails mid-way
        row["state"] = (_unpublished_state(client, row["name"]) if i < UNPUBLISHED_READS
                        else "no published version")
    return rows


UNPUBLISHED_READS = 20


def _unpublished_state(client, name: str) -> str:
    """What a registry model with versions but no `latest` holds: drafts only, all yanked, or
    both. The listing counts versions but not their states: one more read each, for the first
    UNPUBLISHED_READS of them. A failed read says no more than the listing did."""
    from ..errors import OscarZooError

    try:
        states = {v.get("status") for v in client.versions(name, cache_hint=False)}
    except OscarZooError:
        return "no published version"
    return {frozenset({"draft"}): "drafts only", frozenset({"yanked"}): "all yanked",
            frozenset({"draft", "yanked"}): "drafts and yanked only"}.get(
        frozenset(states), "no published version")


def _list_table(rows: list[dict]) -> str:
    if not rows:
        return "no models match"
    lines = [f"{'NAME':<26} {'HUB ID':<36} {'LATEST':>6} {'RECOMMENDED':>11} {'VALIDATION':<15} "
             f"{'SOURCES':<22} CACHED"]
    for r in rows:
        lines.append(f"{r['name']:<26} {r['hub_id']:<36} {r['latest'] or '-':>6} "
                     f"{r['recommended'] or '-':>11} {_validation_cell(r):<15} "
                     f"{_sources_cell(r):<22} {','.join(r['cached']) or '-'}")
    return "\n".join(lines)


def _sources_cell(row: dict) -> str:
    """registry (drafts only): a registry model with no published version says why LATEST is
    empty, where a bare pull of it fails."""
    state = row.get("state")
    return ",".join(f"registry ({state})" if s == "registry" and state not in (None, "published")
                    else s for s in row["sources"]) or "-"


def _validation_cell(row: dict) -> str:
    """`v2 passed`: the verdict with the version it is of (recommended, else latest). A bare
    "yes" beside LATEST 5 read as v5's, when v5 had failed and v2, recommended, had passed."""
    version = row.get("validated_version")
    if version is None:
        return "-"
    verdict = {True: "passed", False: "FAILED", None: "no report"}[row["validated"]]
    return f"v{version} {verdict}"


@click.command("show")
@click.argument("spec", metavar="NAME[@VERSION|@ALIAS]")
@json_option
def show_command(spec, as_json):
    """Geometry, versions, validation and sources of a model (or of one version)."""
    from .. import settings
    from ..cache import Cache
    from ..catalog import find, suggest
    from ..errors import ModelNotFound, NotFound, OfflineError, RemoteError
    from ..registry_client import RegistryClient
    from ..sources.base import parse_spec

    name, ref = parse_spec(spec)
    entry = find(name)
    data: dict = {"name": entry.name if entry else name, "catalog": None, "registry": None,
                  "version": None, "cache": []}
    if entry is not None:
        data["catalog"] = {"hub_id": entry.hub_id, "architecture": entry.architecture,
                           "geometry": entry.geometry.to_dict(), "aliases": list(entry.aliases),
                           "rotationzoo": None if entry.zoo is None else {
                               "hf": f"{settings.get('hf_zoo_repo')}/{entry.zoo.folder}",
                               "modelscope": f"{settings.get('modelscope_zoo_repo')}/{entry.zoo.folder}",
                               "files": [entry.zoo.k_file, entry.zoo.v_file],
                               "per_head": entry.zoo.per_head},
                           "serving": {"k_clip": entry.k_clip, "v_clip": entry.v_clip,
                                       "group_size": entry.group_size, "sink_tokens": entry.sink_tokens,
                                       "recent_tokens": entry.recent_tokens,
                                       "lloyd_max": entry.lloyd_max, "gpus": entry.gpus},
                           "notes": entry.notes}
    client = RegistryClient()
    unanswered = ""     # why the registry's word is missing, for an unknown model's error
    if client.configured and not settings.is_offline():
        try:
            data["registry"] = client.model(data["name"])
        except (OfflineError, RemoteError) as e:
            _without_registry(e, "showing the catalog's and the local cache's word only")
            unanswered = (f"{name!r} is not in the catalog or the local cache, and the registry "
                          f"({client.where}) did not answer, which may hold it: try again once it "
                          "does.")
        except NotFound:
            if entry is None:
                raise
        # outside the try: a version the registry lacks is an error, not a silent omission
        if data["registry"] is not None:
            data["name"] = data["registry"]["name"]
            if not ref.is_default:
                try:
                    data["version"] = client.version(data["name"], ref.version or ref.alias)
                except (OfflineError, RemoteError) as e:    # the cache may answer it below
                    _without_registry(e, "the version is shown from the local cache, if there")
    cache = Cache()
    if data["registry"] is None and entry is None:   # the cache's name for a hub id it holds
        data["name"] = cache.model_named(data["name"])
    held = list(cache.held(data["name"]))
    # a model only a registry knows, pulled earlier, is still shown from the cache offline
    if entry is None and data["registry"] is None and not held:
        raise ModelNotFound(unanswered or f"unknown model {name!r}.", suggestions=suggest(name))
    for h in held:
        meta = cache.read_meta(h.model, h.digest)
        refs = [r for r, d in cache.refs(h.model).items() if d == h.digest]
        data["cache"].append({"digest": h.digest, "refs": refs, "path": str(h.path),
                              "layers": h.layers, "source": meta.get("origin"),
                              "version": meta.get("version")})
    if not ref.is_default and data["version"] is None:     # no registry answered: the cache may
        data["version"] = _cached_version(data["cache"], ref, data["name"])
    emit(data, as_json, _show_text)


def _cached_version(cached: list[dict], ref, name: str) -> dict:
    from ..errors import VersionNotFound

    for c in cached:
        by_number = ref.version is not None and c["version"] == ref.version
        if by_number or set(ref.cache_refs()) & set(c["refs"]):
            return {"version": c["version"] or ref.label, "status": "cached", "digest": c["digest"]}
    raise VersionNotFound(f"{name}@{ref.label} is not in the cache, and no registry answered (offline, "
                          "OSCAR_ZOO_ENDPOINT unset, or the registry down): connect, or `oscar-zoo "
                          "cache ls` for what is here")


def _show_text(d: dict) -> str:
    lines = [d["name"]]
    c = d.get("catalog")
    r = d.get("registry")
    if not c and r:     # a model only the registry knows: what the catalog would say, from it
        lines += _model_lines(r["hub_id"], r.get("architecture"), r["geometry"])
    if c:
        lines += _model_lines(c["hub_id"], c["architecture"], c["geometry"])
        lines += [f"  OSCAR ships  clip K {c['serving']['k_clip']:g} / V {c['serving']['v_clip']:g}, "
                  f"group {c['serving']['group_size']}, sink {c['serving']['sink_tokens']} + "
                  f"recent {c['serving']['recent_tokens']}"
                  f"{', Lloyd-Max buckets' if c['serving']['lloyd_max'] else ''}, "
                  f"{plural(c['serving']['gpus'], 'GPU')}"]
        if c["rotationzoo"]:
            z = c["rotationzoo"]
            lines.append(f"  rotationzoo  hf:{z['hf']}  modelscope:{z['modelscope']}"
                         + (" (per KV head)" if z["per_head"] else ""))
        if c["notes"]:
            lines.append(f"  notes        {c['notes']}")
    if r:
        aliases = ", ".join(f"{a}={v}" for a, v in sorted(r.get("version_aliases", {}).items()))
        lines.append(f"  registry     {r.get('versions_count', 0)} version(s); aliases: {aliases or '-'}")
        for v in r.get("versions", []):
            val = {True: "validated", False: "FAILED validation", None: "not validated"}[v.get("validation_passed")]
            lines.append(f"    v{v['version']:<4} {v['status']:<9} {v['digest'][:12]}  {val:<18} "
                         f"{v['granularity']:<7} {','.join(v.get('aliases', []))}")
    v = d.get("version")
    if v:
        lines.append(f"  version {v['version']}: {v['status']}, digest {v['digest']}")
        lines += _version_lines(v)
        for f in v.get("files", []):
            lines.append(f"    {f['name']:<24} {_size(f['size']):>9}  {f['sha256'][:16]}")
    for s in d["cache"]:
        part = f" layers {s['layers']}" if s["layers"] else ""
        lines.append(f"  cached       {s['digest'][:12]}{part} refs {','.join(s['refs']) or '-'}  {s['path']}")
    return "\n".join(lines)


def _model_lines(hub_id: str, architecture: str | None, g: dict) -> list[str]:
    """The hub id and geometry lines, from the catalog or the registry (the same shape)."""
    layers = len(g.get("attention_layers") or []) or g["num_layers"]
    return [f"  hub id       {hub_id}" + (f" ({architecture})" if architecture else ""),
            f"  geometry     {layers} of {g['num_layers']} layers with a KV cache, "
            f"{g['num_q_heads']} q / {g['num_kv_heads']} KV heads, head_dim {g['head_dim']}"]


def _version_lines(v: dict) -> list[str]:
    """What the web UI's version page leads with: why it was yanked, the clip pair engines get,
    the validation against the baselines."""
    out = [f"    yanked       {v['yank_reason']}"] if v.get("yank_reason") else []
    clip = (v.get("manifest") or {}).get("clip") or {}
    if "k_global" in clip:
        how = f"searched per {clip.get('granularity')}" if clip.get("searched") else "fixed"
        out.append(f"    clip         K {clip['k_global']:g} / V {clip['v_global']:g} ({how}; "
                   "the pair an engine is given)")
    val = v.get("validation") or {}
    by = {r["name"]: r["delta_nll"] for r in val.get("variants", [])}
    if "bundle" in by:
        # as served (one K / V pair) beside it: the verdict judges both
        served = f", as served {by['bundle-served']:+.4f}" if "bundle-served" in by else ""
        rest = ", ".join(f"{n} {by[n]:+.4f}" for n in ("hadamard", "naive") if n in by)
        out.append(f"    validation   {'passed' if val.get('passed') else 'FAILED'}: extra loss "
                   f"{by['bundle']:+.4f}{served} nats/token ({rest}) at context "
                   f"{val.get('context_len')}")
        if not val.get("passed") and val.get("criterion"):
            out.append(f"    criterion    {val['criterion']}")
    return out


# --- verify, prune, cache ls, cache rm ---------------------------------------------------------

@click.command("verify")
@click.argument("target", required=False, metavar="[NAME|BUNDLE_DIR]")
@json_option
def verify_command(target, as_json):
    """Re-hash the cache (all of it, or one model), or verify a bundle directory.

    A corrupt blob is deleted together with the snapshots that use it, so the next pull
    fetches it again; a corrupt export (engine files) is deleted, so the next pull builds it
    again. Exit status 1 if anything was wrong.
    """
    _small_blas()
    import sys

    from ..cache import Cache, verify_cache

    if target and Path(target).is_dir():
        from ..bundle import summary, verify_bundle

        manifest = verify_bundle(target)
        emit({"verified": target, **summary(manifest)}, as_json,
             lambda d: f"{target}: OK (hashes, shapes, finiteness, orthogonality)")
        return
    name = None
    cache = Cache()
    if target:
        from ..catalog import find
        from ..pull import cached_name
        from ..sources.base import parse_spec

        asked = parse_spec(target)[0]
        name = cached_name(cache, find(asked), asked)
    if name is not None and not cache.model_dir(name).is_dir():
        # checking nothing is not a pass: a typo would read "all checksums match"
        from ..errors import NotFound

        raise NotFound(f"{target!r} is neither a bundle directory nor a model in the cache "
                       f"({cache.root}); `oscar-zoo cache ls` lists what is cached")
    checked, problems = verify_cache(cache, name)
    data = {"checked": checked, "problems": [p.__dict__ for p in problems]}
    emit(data, as_json, lambda d: "\n".join(
        [f"CORRUPT {p['model']} {p['digest'][:12]} {p['file']}: {p['problem']} (deleted; "
         + ("built again on its next use)" if p["file"].startswith("exports/") else "pull again)")
         for p in d["problems"]] + [f"checked {d['checked']} files: "
                                    + ("all checksums match" if not d["problems"]
                                       else f"{len(d['problems'])} problem(s)")]))
    if problems:
        sys.exit(1)


@click.command("prune")
@click.option("--dry-run", is_flag=True, help="Only list what would be removed.")
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation.")
@json_option
def prune_command(dry_run, yes, as_json):
    """Remove snapshots no ref points at, unreferenced blobs, old partial downloads, and the
    import records of RotationZoo bundles no longer cached."""
    from ..cache import Cache, prune

    cache = Cache()
    plan = prune(cache, dry_run=True)
    total = sum(n for _, n in plan)
    if not plan:   # the same keys as below: a script reads dry_run either way
        emit({"removed": [], "bytes": 0, "dry_run": dry_run}, as_json, lambda d: "nothing to prune")
        return
    if not dry_run and not yes:
        info("\n".join(f"  {p} ({_size(n)})" for p, n in plan))
        click.confirm(f"remove {len(plan)} item(s), {_size(total)}?", abort=True, err=True)
    if not dry_run:
        plan = prune(cache, only={p for p, _ in plan})
        total = sum(n for _, n in plan)
    emit({"removed": [str(p) for p, _ in plan], "bytes": total, "dry_run": dry_run}, as_json,
         lambda d: "\n".join(d["removed"] + [f"{'would free' if dry_run else 'freed'} {_size(total)}"]))


@click.group("cache")
def cache_group():
    """Inspect the local cache (OSCAR_ZOO_CACHE), or remove models (or the bundles calibrate
    saved there) from it."""


@cache_group.command("ls")
@json_option
def cache_ls(as_json):
    """Every cached bundle and --layers part: model, refs, digest, layers, source, size. Then
    the bundles `oscar-zoo calibrate` saved in the cache when its --out was full, if any."""
    from ..cache import Cache, _size as dir_size

    cache = Cache()
    rows = [r for r in (_cache_row(cache, h) for h in cache.held()) if r is not None]
    rows.sort(key=lambda r: (r["model"], r["digest"], _first_layer(r["layers"])))
    exports = cache.root / "exports"
    rescued = [_rescued_row(r) for r in cache.rescued_bundles()]
    data = {"root": str(cache.root), "bundles": rows,
            "exports_bytes": dir_size(exports) if exports.exists() else 0, "rescued": rescued}
    emit(data, as_json, _cache_table)
    if rescued and not as_json:
        # only place a user who missed calibrate's one error line learns what these are
        info(_rescued_hint(rescued))


def _rescued_hint(rows: list[dict]) -> str:
    """What to do with the RESCUED rows: move a saved bundle, remove any; and why a row with no
    bundle has nothing to move."""
    saved = [r for r in rows if r["state"] == "saved"]
    hint = (f"{plural(len(rows), 'dir')} made by `oscar-zoo calibrate` when its --out was full: "
            + ("move a saved BUNDLE where it belongs (`mv PATH DIR`), or " if saved else "")
            + "remove them with `oscar-zoo cache rm --rescued [NAME]...`")
    if any(r["state"] == "incomplete" for r in rows):
        hint += ("; an (incomplete) one holds no whole bundle, nothing to move: a calibrate was "
                 "killed while saving it, or is still saving it")
    if any(r["state"] == "unreadable" for r in rows):
        hint += "; an (unreadable) one is not yours to read (another user's calibrate?)"
    return hint


def _cache_row(cache, h) -> dict | None:
    """One snapshot (layers None) or --layers part; a part shares its bundle's refs and meta.
    None for one a `cache rm` or prune removed while ls looked (ls takes no lock)."""
    meta = cache.read_meta(h.model, h.digest)
    refs = [r for r, d in cache.refs(h.model).items() if d == h.digest]
    try:
        size = sum(p.stat().st_size for p in h.path.iterdir() if p.exists())
    except FileNotFoundError:
        return None
    return {"model": h.model, "digest": h.digest, "refs": refs, "layers": h.layers,
            "version": meta.get("version"), "source": meta.get("source"), "origin": meta.get("origin"),
            "size": size, "path": str(h.path), "pulled_at": meta.get("pulled_at")}


def _rescued_row(r) -> dict:
    """One dir calibrate made under rescued/ (cache.Rescued, read as it was listed); path is
    the bundle (what to move), or the dir where it holds none. size None: it cannot be read.
    saved_at in UTC, as a bundle's pulled_at."""
    return {"name": r.name, "bundle": r.bundle.name if r.bundle else None, "state": r.kind,
            "path": str(r.bundle or r.path), "size": r.size,
            "saved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(r.saved))}


def _first_layer(spec: str | None) -> int:
    """Whole snapshot first, then its parts by their first layer (not 10-19 before 2-9)."""
    head = re.match(r"\d+", spec or "")   # 3-7, 3_5, 3-7_9: layer_spec's spellings
    return int(head.group()) if head else -1


def _cache_table(d: dict) -> str:
    return "\n".join([f"cache {d['root']}"] + _bundle_lines(d) + _rescued_lines(d["rescued"]))


def _bundle_lines(d: dict) -> list[str]:
    if not d["bundles"]:
        return ["(empty)"]
    lines = [f"{'MODEL':<24} {'REFS':<26} {'DIGEST':<12} {'LAYERS':<9} {'VERSION':>7} {'SOURCE':<10} "
             f"{'SIZE':>9}"]
    for r in d["bundles"]:
        lines.append(f"{r['model']:<24} {','.join(r['refs']) or '-':<26} {r['digest'][:12]:<12} "
                     f"{r['layers'] or 'all':<9} {r['version'] or '-':>7} {r['source'] or '-':<10} "
                     f"{_size(r['size']):>9}")
    lines.append(f"exports: {_size(d['exports_bytes'])}")
    return lines


def _rescued_lines(rows: list[dict]) -> list[str]:
    """A section of its own: not cached bundles (no ref, no digest), but calibrations to move."""
    if not rows:
        return []
    lines = ["", f"{'RESCUED':<36} {'BUNDLE':<24} {'SAVED (UTC)':<20} {'SIZE':>9} PATH"]
    for r in rows:
        bundle = r["bundle"] or f"({r['state']})"
        lines.append(f"{r['name']:<36} {bundle:<24} {r['saved_at']:<20} "
                     f"{_rescued_size(r['size']):>9} {r['path']}")
    return lines


def _rescued_size(n: int | None) -> str:
    return "?" if n is None else _size(n)      # "-" would read as nothing in it


@cache_group.command("rm")
@click.argument("specs", nargs=-1, metavar="NAME[@REF]...")
@click.option("--rescued", is_flag=True,
              help="Remove bundles `oscar-zoo calibrate` saved in the cache when its --out was "
                   "full: each NAME as `oscar-zoo cache ls` shows it under RESCUED, or all.")
@click.option("--dry-run", is_flag=True, help="Only list what would be removed.")
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation.")
@json_option
def cache_rm(specs, rescued, dry_run, yes, as_json):
    """Remove models, or single versions of them, from the cache.

    NAME removes the model: its refs, snapshots, --layers parts and exports. NAME@REF (a
    version, an alias or a digest, as `oscar-zoo cache ls` shows them) removes that bundle and
    the refs pointing at it. Then the blobs no other bundle uses go; shared ones stay. Nothing
    is removed if any argument is not in the cache.

    With --rescued, each NAME is a bundle calibrate saved under the cache's rescued/ dir (its
    calibrate-<time>-<random> name in `oscar-zoo cache ls`). No NAME removes every saved one,
    and a dir with no bundle (a calibrate killed) or an empty one once an hour old: sooner,
    a calibrate may still be writing it.

    \b
    oscar-zoo cache rm glm-4.7-fp8                 # the whole model
    oscar-zoo cache rm glm-4.7-fp8@3 qwen3-8b@latest --dry-run
    oscar-zoo cache rm glm-4.7-fp8@1a2b3c4d5e6f --yes --json
    oscar-zoo cache rm --rescued                   # the bundles calibrate rescued
    """
    from functools import partial

    from ..cache import Cache
    from ..cache_remove import resolve_removal

    cache = Cache()
    if rescued:
        _rm_rescued(cache, specs, dry_run, yes, as_json)
        return
    if not specs:
        raise click.UsageError("Missing argument 'NAME[@REF]...': name the models to remove, "
                               "or give --rescued for the bundles calibrate saved in the cache")
    targets = resolve_removal(cache, specs)     # every argument checked before anything goes
    _remove_confirmed(partial(_remove_models, cache, targets), _rm_what,
                      partial(_rm_data, dry_run=dry_run), dry_run, yes, as_json,
                      "`oscar-zoo prune` retries what no ref uses")


def _rm_rescued(cache, names, dry_run: bool, yes: bool, as_json: bool) -> None:
    """`cache rm --rescued [NAME]...`."""
    from functools import partial

    from ..cache_remove import resolve_rescued

    found = resolve_rescued(cache, names)   # every name checked before anything goes
    if not names:
        _say_kept(cache, found)
    _remove_confirmed(partial(_remove_rescued, cache, found), _rescued_what,
                      partial(_rescued_rm_data, dry_run=dry_run), dry_run, yes, as_json,
                      "fix its permissions and run `oscar-zoo cache rm --rescued` again, or "
                      "remove it by hand")


def _remove_models(cache, targets, confirmed=None, dry_run: bool = False):
    """remove(): of no more than the paths of the plan the user `confirmed`, if given."""
    from ..cache_remove import remove

    only = None if confirmed is None else {p for p, _ in confirmed.paths}
    return remove(cache, targets, dry_run=dry_run, only=only)


def _remove_rescued(cache, found, confirmed=None, dry_run: bool = False):
    """remove_rescued(): of the dirs the user `confirmed`, each as it was then (one a calibrate
    finished, or a bundle moved in or out of, since stays), else of those `found`."""
    from ..cache_remove import remove_rescued

    return remove_rescued(cache, found if confirmed is None else confirmed.rescued, dry_run=dry_run)


def _say_kept(cache, found) -> None:
    """What `--rescued` with no NAME leaves, and why: else a user finds it in `cache ls` still,
    after "nothing to remove"."""
    going = {r.name for r in found}
    kept = [r for r in cache.rescued_bundles() if r.name not in going]
    if kept:
        why = {"incomplete": "no whole bundle, written to in the last hour: a calibrate may "
                             "still be saving it",
               "unreadable": "not readable by you"}
        info(f"keeping {plural(len(kept), 'rescued dir')}: "
             + "; ".join(f"{r.name} ({why.get(r.kind, r.kind)})" for r in kept)
             + ". Name one to remove it anyway: `oscar-zoo cache rm --rescued NAME`")


def _remove_confirmed(run, what, data, dry_run: bool, yes: bool, as_json: bool,
                      retry: str) -> None:
    """cache rm's steps for models and rescued bundles alike: plan (removing nothing), ask
    unless --yes, remove no more than the plan the user confirmed, report; exit 1 if a path
    would not go. `run(confirmed=None, dry_run=)` plans, or removes what the `confirmed` plan
    holds; `what(plan)` names what goes, `data(plan)` is the JSON, `retry` what to do about a
    path that stayed."""
    import sys

    plan = run(dry_run=True)
    if not plan.paths and not plan.refs:
        emit(data(plan), as_json, lambda d: "nothing to remove")
        return
    if not dry_run and not yes:
        info(_rm_plan_text(plan))
        click.confirm(f"remove {what(plan)}, freeing {_size(plan.bytes)}?", abort=True, err=True)
    if not dry_run:
        plan = run(confirmed=plan)
        for p in plan.failed:
            warn(f"could not remove all of {p} (permissions?); {retry}")
    emit(data(plan), as_json, lambda d: "\n".join(
        [_rm_plan_text(plan) if dry_run else "\n".join(d["removed"]),
         f"{'would free' if dry_run else 'freed'} {_size(d['bytes'])}"]))
    if plan.failed:
        sys.exit(1)


def _rm_data(plan, dry_run: bool) -> dict:
    return {"bundles": plan.bundles, "refs": [f"{m}/{r}" for m, r, _ in plan.refs],
            "removed": [str(p) for p, _ in plan.paths], "bytes": plan.bytes,
            "dry_run": dry_run, "failed": [str(p) for p in plan.failed]}


def _rm_what(plan) -> str:
    models = sorted({b["model"] for b in plan.bundles})
    if not plan.bundles:
        return f"{plural(len(plan.refs), 'ref')} and {plural(len(plan.paths), 'path')}"
    return (f"{plural(len(plan.bundles), 'bundle')} of {', '.join(models)} "
            f"({plural(len(plan.paths), 'path')})")


def _rescued_rm_data(plan, dry_run: bool) -> dict:
    """_rm_data, and each rescued dir that goes as `cache ls --json` shows it."""
    return {**_rm_data(plan, dry_run), "rescued": [_rescued_row(r) for r in plan.rescued]}


def _rescued_what(plan) -> str:
    """1 rescued bundle and 2 rescued dirs with no bundle (1 incomplete, 1 empty)."""
    kinds = [r.kind for r in plan.rescued]
    saved, rest = kinds.count("saved"), [k for k in kinds if k != "saved"]
    said = [plural(saved, "rescued bundle")] if saved else []
    if rest:
        counts = ", ".join(f"{rest.count(k)} {k}" for k in dict.fromkeys(rest))
        said.append(f"{plural(len(rest), 'rescued dir')} with no bundle ({counts})")
    return " and ".join(said)


_RESCUED_KIND = {"incomplete": "(incomplete: calibrate killed or still writing)",
                 "empty": "(empty: its bundle was moved out)",
                 "unreadable": "(unreadable: another user's?)"}


def _rescued_plan_lines(plan) -> list[str]:
    """Each rescued dir that goes: its name, its bundle or why it has none, when it was saved."""
    lines = []
    for r in plan.rescued:
        row = _rescued_row(r)
        lines.append(f"  {r.name} {row['bundle'] or _RESCUED_KIND[r.kind]}, saved "
                     f"{row['saved_at']} ({_rescued_size(r.size)}) {r.path}")
    return lines


def _rm_plan_text(plan) -> str:
    """The bundles that go (with their refs), refs to bundles not cached, rescued dirs, then
    every other path."""
    lines = _rescued_plan_lines(plan)
    listed = {r.path for r in plan.rescued}
    for b in plan.bundles:
        version = f"v{b['version']}" if b["version"] is not None else "-"
        lines.append(f"  {b['model']} {b['digest'][:12]} {version} "
                     f"{'layers ' + b['layers'] if b['layers'] else 'all layers'}, "
                     f"refs {','.join(b['refs']) or '-'}")
    shown = {(b["model"], r) for b in plan.bundles for r in b["refs"]}
    lines += [f"  ref {m}/{r} (names {d[:12]}, not cached)" for m, r, d in plan.refs
              if (m, r) not in shown]
    lines += [f"  {p} ({_size(n)})" for p, n in plan.paths if p not in listed]
    return "\n".join(lines)


# --- login, logout, export, publish ------------------------------------------------------------

@click.command("login")
@click.option("--token", help="The registry token (default: prompt for it, hidden).")
def login_command(token):
    """Check a registry token against OSCAR_ZOO_ENDPOINT and store it in the user config dir
    (mode 0600) for publish and other writes. A refused token is not stored: one that is not
    shaped like a registry token, or one the registry refuses. With no OSCAR_ZOO_ENDPOINT set,
    a well-shaped token is stored unverified, and login says so."""
    from ..registry_client import RegistryClient, store_token

    if not token:
        token = click.prompt("registry token", hide_input=True, err=True)
    token = token.strip()
    if not token:
        raise click.UsageError("the token is empty")
    _check_token_shape(token)   # before anything: a typo must not replace a working token
    client = RegistryClient(token=token)
    if client.configured:
        with client:
            me = client.whoami()
        info(f"logged in to {client.where} as {me['actor']} (scopes: {', '.join(me['scopes'])})")
    path = store_token(token)
    info(f"token stored in {path} (readable by you only); OSCAR_ZOO_TOKEN overrides it")
    if not client.configured:   # nothing to ask: said, so "stored" is not read as "accepted"
        warn("no registry configured (OSCAR_ZOO_ENDPOINT), so the token was stored unverified; "
             "set OSCAR_ZOO_ENDPOINT and run `oscar-zoo whoami` to check it")


@click.command("logout")
@json_option
def logout_command(as_json):
    """Forget the registry token `oscar-zoo login` stored in the user config dir
    (OSCAR_ZOO_CONFIG_DIR). Nothing stored is not an error. The token stays valid on the
    registry until its operator revokes it, and OSCAR_ZOO_TOKEN, if set, is still sent: logout
    warns, as it cannot unset a variable of your shell."""
    from ..registry_client import remove_stored_token, stored_token_path

    removed = remove_stored_token()
    path = removed or stored_token_path()
    if removed:
        info(f"logged out: removed the token stored in {path} (it stays valid on the registry "
             "until its operator revokes it)")
    else:
        info(f"not logged in: no token stored in {path}; nothing to remove")
    warnings = _token_env_warnings()
    warn_unless_json(warnings, as_json)
    if as_json:
        emit({"removed": removed is not None, "path": str(path), "warnings": warnings}, True)


def _token_env_warnings() -> list[str]:
    """What logout leaves sending a token: the environment's (named, never its value)."""
    from .. import settings

    if not (settings.raw("token") or "").strip():
        return []
    env = settings.setting("token").env
    return [f"{env} is set, and its token is still sent with every request (it overrides the "
            f"stored one); logout cannot unset it: run `unset {env}` in your shell"]


def _check_token_shape(token: str) -> None:
    """Refuse a token the registry would refuse by its shape alone, by the registry's own rule,
    with no request: with no registry configured, login has nothing else to check it against.
    Never repeats the token: stderr goes into CI logs."""
    from ..registry_client import MALFORMED_TOKEN, TOKEN_SHAPE

    if not TOKEN_SHAPE.fullmatch(token):
        from ..errors import InvalidInput

        raise InvalidInput(f"{MALFORMED_TOKEN}, and nothing was stored (a token stored before "
                           "is kept); give the whole token `oscar-zoo tokens create` printed, "
                           "without quotes or 'Bearer '")


@click.command("whoami")
@json_option
def whoami_command(as_json):
    """Who the stored token (or OSCAR_ZOO_TOKEN) is at OSCAR_ZOO_ENDPOINT, and its scopes."""
    from ..registry_client import RegistryClient

    with RegistryClient() as client:
        emit({**client.whoami(), "registry": client.where}, as_json,
             lambda d: f"{d['actor']} at {d['registry']} (scopes: {', '.join(d['scopes'])})")


@click.command("export")
@click.argument("target", metavar="NAME[@VERSION]|BUNDLE_DIR")
@click.option("--format", "fmt", type=FORMAT_CHOICE, default="sglang", show_default=True)
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path))
@click.option("--layers", metavar="SPEC", help="Only these layers, e.g. 0-45.")
@json_option
def export_command(target, fmt, out, layers, as_json):
    """Write engine files for a cached bundle (or a bundle directory); no network."""
    _small_blas()
    from ..cache import Cache
    from ..catalog import find
    from ..export import export
    from ..files import sha256_file
    from ..pull import from_cache, _layers_of
    from ..sources.base import parse_spec

    cache = Cache()
    bdir, warnings = None, []
    if Path(target).is_dir():
        from ..bundle import verify_bundle

        verify_bundle(target)
        bdir, digest = Path(target), sha256_file(Path(target) / "bundle.json")
    # as pull --format does: prune and cache rm wait, instead of taking away the snapshot (or
    # the exports/ dir) this reads and writes
    with cache.out_of_space(f"exporting {target}"), cache.gc_guard():
        if bdir is None:
            name, ref = parse_spec(target)
            cached = from_cache(cache, find(name), name, ref, "export reads the cache only", layers)
            bdir, digest = cached.path, cached.digest
            # the bundle's own warnings (yanked, a draft), as pull gives them for the same copy
            warnings = [n.text for n in cached.notes if n.in_recipe]
        chosen = _layers_of(bdir, layers) if layers is not None else None  # '' is refused there
        result = export(cache, digest, bdir, fmt, chosen, out)
    warn_unless_json(warnings + _recipe_notes(result), as_json)
    emit({**result.to_dict(), "warnings": warnings}, as_json,
         lambda d: "\n".join([f"# WARNING: {w}" for w in warnings if result.recipe is not None]
                             + [_recipe_text(result)]))


@click.command("publish")
@click.argument("bundle_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--status", type=click.Choice(["draft", "published"]), default=None,
              help="draft (`oscar-zoo promote NAME@V` later) or published. Default: published, "
                   "or a draft when the bundle's validation report failed.")
@click.option("--name", help="Model to publish under (default: the manifest's model name).")
@json_option
def publish_command(bundle_dir, status, name, as_json):
    """Upload a bundle to the registry as a new immutable version (needs `oscar-zoo login`)."""
    _small_blas()
    from ..bundle import require_whole, verify_bundle
    from ..errors import InvalidInput
    from ..registry_client import RegistryClient

    require_whole(bundle_dir)   # fail here, with the local path, before any upload
    verify_bundle(bundle_dir)
    with RegistryClient() as client:
        try:
            body, created = client.publish(bundle_dir, name=name, status=status)
        except InvalidInput as e:
            raise _publish_fix(e, name) from None
    verb = ("stored as a draft:" if body.get("status") == "draft" else "published") if created \
        else "already there as"
    if created and status is None and body.get("status") == "draft" and not as_json:
        warn("its validation report failed, so the registry kept it as a draft (not latest); "
             "`oscar-zoo promote` publishes it, or publish with --status published")
    emit({**body, "created": created}, as_json, lambda d: (
        f"{verb} {d['model']} v{d['version']} ({d['status']}, sha256:{d['digest'][:12]})"))


def _publish_fix(e: Exception, name: str | None) -> Exception:
    """The registry's refusal of the model name (its answer names the model to post under,
    `bundle_model`: the bundle's, or the registry's name for it), with this command's fix in
    place of its API's (a REST path). Any other refusal, or that one from a registry that does
    not name the model yet, keeps the registry's words."""
    import shlex

    model = getattr(e, "extensions", {}).get("bundle_model")
    if not isinstance(model, str) or not model:
        return e
    # the registry's reasons say "what; how to fix": its what, then this command's fix
    what = str(e).rpartition("; ")[0] or str(e)
    drop = "drop --name (publish takes the model from bundle.json), or " if name is not None else ""
    return type(e)(f"{what}; {drop}pass --name {shlex.quote(model)}")


def register(cli: click.Group) -> None:
    for cmd in (pull_command, list_command, show_command, verify_command, prune_command,
                cache_group, login_command, logout_command, whoami_command, export_command,
                publish_command):
        cli.add_command(cmd)
    cli.add_command(_alias(list_command, "ls"))
    cli.add_command(_alias(show_command, "info"))
