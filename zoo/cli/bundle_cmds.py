"""`oscar-zoo inspect` and `oscar-zoo convert`: look into a bundle, move it to and from OSCAR files."""

from __future__ import annotations

import json

from pathlib import Path

import click

from ..errors import BundleFormatError
from .output import emit, info, json_option, plural, warn_unless_json, window_note


@click.command("inspect")
@click.argument("bundle_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--no-verify", is_flag=True, help="Skip hashing and tensor checks (faster).")
@json_option
def inspect_command(bundle_dir: Path, no_verify: bool, as_json: bool):
    """Verify a bundle directory and summarise it (model, geometry, method, clips, validation)."""
    from ..bundle import part_of, read_manifest, verify_bundle

    manifest = read_manifest(bundle_dir) if no_verify else verify_bundle(bundle_dir)
    data = _summary(manifest)
    part = part_of(bundle_dir)
    # a --layers output: the geometry still counts the whole model's layers
    data["partial_layers"] = part["layers"] if part else None
    data["verified"] = not no_verify
    emit(data, as_json, _human_summary)


def _summary(manifest) -> dict:
    """bundle.summary plus the INT2 cache settings a launch needs besides the group size."""
    from ..bundle import summary

    q = manifest.quantization
    return {**summary(manifest), "scale_dtype": q.scale_dtype, "sink_tokens": q.sink_tokens,
            "recent_tokens": q.recent_tokens, "lloyd_max": q.lloyd_max,
            "validation": _validation(manifest.validation)}


def _validation(report) -> dict | None:
    """What the verdict was measured on: a pass on 2 short windows is not one on 64 long ones."""
    if report is None:
        return None
    data = report.model_dump(mode="json")
    return {key: data[key] for key in ("dataset", "eval_windows", "context_len", "eval_tokens",
                                       "window_by_layer") if key in data}


def _validated_line(d: dict) -> str:
    if d["validated"] is None:
        return "-"
    v = d["validation"]
    windowed = window_note(v)
    return (f"{'passed' if d['validated'] else 'FAILED'} on "
            f"{plural(v['eval_windows'], 'held-out window')} of {v['context_len']:,} tokens "
            f"({v['dataset']})" + (f"; {windowed}" if windowed else ""))


def _human_summary(d: dict) -> str:
    from ..export import layers_arg

    clip = d["clip"]
    part = d.get("partial_layers")
    lines = [
        f"model       {d['model']} ({d['hub_id']})",
        f"layers      {d['layers']} x {d['kv_heads']} KV heads, head_dim {d['head_dim']}"
        + (f"; this --layers output holds {len(part)}: {layers_arg(part)}" if part else ""),
        f"method      {d['method']}; key centering {'on' if d['key_centering'] else 'off'}",
        f"clip        K {clip['k']:g} / V {clip['v']:g} ({clip['granularity']}"
        f"{', searched' if clip['searched'] else ''})",
        f"INT2        group {d['group_size']}, {d['scale_dtype']} scales, BF16 sink "
        f"{d['sink_tokens']} + recent {d['recent_tokens']}{', Lloyd-Max' if d['lloyd_max'] else ''}",
        f"source      {d['source']}, {d['tokens'] or '?'} calibration tokens",
        f"validated   {_validated_line(d)}",
        "files       " + ", ".join(f"{n} ({s:,} B)" for n, s in d["files"].items()),
        f"verified    {'yes: hashes, shapes, finiteness, orthogonality' if d['verified'] else 'skipped'}",
    ]
    return "\n".join(lines)


@click.command("convert")
@click.argument("inputs", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("--from", "from_fmt", type=click.Choice(["sglang"]), help="Import OSCAR .pt files.")
@click.option("--to", "to_fmt", type=click.Choice(["sglang"]), help="Export a bundle to OSCAR .pt files.")
@click.option("--out", "out", required=True, type=click.Path(path_type=Path), help="Output directory.")
@click.option("--model", help="Model (catalog name or hub id) the imported files belong to.")
@click.option("--config", type=click.Path(exists=True, path_type=Path),
              help="config.json giving the geometry of a model the catalog does not know.")
@click.option("--k-clip", type=float, help="K clip ratio to record (default: the model's shipped value).")
@click.option("--v-clip", type=float, help="V clip ratio to record.")
@click.option("--group-size", type=int, help="INT2 group size to record.")
@click.option("--overwrite", is_flag=True, help="Replace an existing output bundle.")
@json_option
def convert_command(inputs, from_fmt, to_fmt, out, model, config, k_clip, v_clip, group_size,
                    overwrite, as_json):
    """Convert between a canonical bundle and OSCAR's SGLang rotation files.

    \b
    oscar-zoo convert --from sglang K.pt V.pt --model qwen3-8b --out bundle/
    oscar-zoo convert --from sglang ZOO_DIR/Qwen3-8B/seq20000_prompt83_group128 --model qwen3-8b --out bundle/
    oscar-zoo convert --to sglang bundle/ --out sglang/
    """
    if bool(from_fmt) == bool(to_fmt):
        raise click.UsageError("pass exactly one of --from sglang or --to sglang")
    if to_fmt:
        if len(inputs) != 1:
            raise click.UsageError("--to sglang takes one bundle directory")
        _to_sglang(inputs[0], out, as_json)
        return
    if not model:
        raise click.UsageError("--from sglang needs --model (the files do not record their model)")
    _check_bundle_out(out, overwrite)
    from .. import bundle as bundle_mod
    from ..catalog import resolve
    from ..files import out_dir_out_of_space
    from ..interop.convert import ServingDefaults, architecture_from_config, import_files

    k_path, v_path = _oscar_pair(inputs)
    entry = architecture_from_config(resolve(model, config), config)
    serving = ServingDefaults.of(entry, k_clip=k_clip, v_clip=v_clip, group_size=group_size)
    if group_size is not None:
        from oscar_zoo.calibrate.jobspec import check_int2_geometry

        # what SGLang's INT2 kernels take; the bundle would record it for every launch recipe
        check_int2_geometry(group_size, entry.geometry)
    bundle = import_files(k_path, v_path, entry, serving)
    notes = _kv_shared_notes(bundle, config)
    with out_dir_out_of_space(out, "writing the bundle"):
        written = bundle_mod.write(bundle, out, overwrite=overwrite)
    info(f"imported {k_path.name} + {v_path.name} -> {out}")
    warn_unless_json(notes, as_json)
    # write() checked what the text's "verified" line names, as `inspect` would
    emit({**_summary(written.manifest), "path": str(out), "verified": True, "warnings": notes},
         as_json, _human_summary)


def _kv_shared_notes(bundle, config: Path | None) -> list[str]:
    """The import is faithful to OSCAR's files, which give every layer its own tensors; on a
    KV-shared model (Gemma 3n, Gemma 4: a config saying so) an engine reads a shared layer's
    cache as its source wrote it but looks tensors up by the layer's own id, so say which
    layers it would serve wrong (and that validate refuses the bundle). Without --config the
    sharing is unknown here; validate checks it against the model."""
    if config is None:
        return []
    from oscar_zoo.calibrate.cache_bits import drift_text, kv_shared_drift, kv_sources

    from ..errors import UnsupportedModelError

    path = Path(config) / "config.json" if Path(config).is_dir() else Path(config)
    try:
        sources = kv_sources(json.loads(path.read_text()))     # resolve() has read it already
    except UnsupportedModelError as e:      # an assistant model: every layer reads another's cache
        return [str(e)]
    drift = kv_shared_drift(bundle, sources)
    if not drift:
        return []
    return [f"KV-shared layers carry other tensors than the layer whose cache they read: "
            f"{drift_text(drift, sources)}. Engines look each layer's tensors up by its own id, "
            "so they would read that cache with the wrong ones, and `oscar-zoo validate` refuses "
            "this bundle; calibrate the model with oscar-zoo instead"]


def _to_sglang(bundle_dir: Path, out: Path, as_json: bool) -> None:
    """`export BUNDLE_DIR --format sglang --out OUT` under its older name: the same files, and
    the same refusal to replace files in OUT that oscar-zoo did not write there (a RotationZoo
    checkout uses OSCAR's very names) and the same mark of what it wrote."""
    from .. import bundle as bundle_mod
    from ..cache import Cache
    from ..export import export
    from ..files import sha256_file
    from ..interop.convert import clip_note

    bundle_mod.verify_bundle(bundle_dir)
    bundle = bundle_mod.read(bundle_dir)
    cache = Cache()
    with cache.out_of_space(f"converting {bundle_dir}"), cache.gc_guard():
        result = export(cache, sha256_file(bundle_dir / "bundle.json"), bundle_dir, "sglang", None, out)
    notes = [n for n in (clip_note(bundle),) if n]
    warn_unless_json(notes, as_json)
    emit({"k": str(result.files["k"]), "v": str(result.files["v"]), "notes": notes}, as_json,
         lambda d: f"{d['k']}\n{d['v']}")


def _check_bundle_out(out: Path, overwrite: bool) -> None:
    if out.exists() and overwrite and not (out / "bundle.json").is_file():
        # the write swaps the whole directory out: a mistyped --out would lose its files
        raise click.UsageError(f"{out} exists and is not a bundle (no bundle.json in it); "
                               "--overwrite replaces only a bundle: choose another --out")


def _oscar_pair(inputs: tuple[Path, ...]) -> tuple[Path, Path]:
    """Two files, or a directory holding exactly one k_rotation*.pt and one v_rotation*.pt."""
    if len(inputs) == 2:
        return inputs[0], inputs[1]
    if len(inputs) != 1 or not inputs[0].is_dir():
        raise click.UsageError("give the K and V .pt files, or one directory holding them")
    d = inputs[0]
    pairs = {side: sorted(d.glob(f"{side}_rotation*.pt")) for side in ("k", "v")}
    for side, found in pairs.items():
        if len(found) != 1:
            # Never guess: picking the shared file for a per-head model collapses it (oscar-spec 7.2).
            names = ", ".join(p.name for p in found) or "none"
            raise BundleFormatError(f"{d} holds {len(found)} {side}_rotation*.pt files ({names}); "
                                    "name the K and V files explicitly")
    return pairs["k"][0], pairs["v"][0]


def register(cli: click.Group) -> None:
    cli.add_command(inspect_command)
    cli.add_command(convert_command)
