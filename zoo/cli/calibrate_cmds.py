"""`oscar-zoo calibrate` and `oscar-zoo validate`: the GPU side (torch loads inside the commands)."""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Callable, ContextManager, Iterator

import click

from .. import settings
from ..files import out_of_space
from .output import emit, info, json_option, warn, window_note


class PhaseBars:
    """Progress on stderr: one tqdm bar per phase on a terminal (pass1: 12/30 [layer 11] ...);
    elsewhere (a log file, a job's output, CI) plain lines, one when a phase starts and ends and
    at most one every LOG_EVERY seconds between, instead of a bar redrawn with carriage returns."""

    LOG_EVERY = 10.0

    def __init__(self, enabled: bool = True):
        self.enabled, self.bar, self.phase = enabled, None, None
        self.terminal = sys.stderr.isatty()
        self.logged_at = 0.0

    def __call__(self, phase: str, done: int, total: int, **extra):
        if not self.enabled:
            return
        shown = {k: (f"{v:.3f}" if isinstance(v, float) else v) for k, v in extra.items()}
        if not self.terminal:
            self._line(phase, done, total, shown)
            return
        from tqdm import tqdm

        if phase != self.phase:
            self.close()
            self.phase = phase
            self.bar = tqdm(total=total, desc=phase, unit="step", leave=True, dynamic_ncols=True)
        self.bar.n = done
        self.bar.set_postfix(shown, refresh=False)
        self.bar.refresh()

    def _line(self, phase: str, done: int, total: int, shown: dict) -> None:
        now = time.monotonic()
        if phase == self.phase and done < total and now - self.logged_at < self.LOG_EVERY:
            return
        self.phase, self.logged_at = phase, now
        tail = "".join(f" {k}={v}" for k, v in shown.items())
        print(f"{phase}: {done}/{total}{tail}", file=sys.stderr, flush=True)

    def close(self):
        if self.bar is not None:
            self.bar.close()
            self.bar = None


@click.command("calibrate")
@click.argument("model")
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Bundle directory to write.")
@click.option("--data", "data", multiple=True,
              help="Calibration text: builtin:pydoc (default), a .txt/.jsonl file, or hf:ORG/NAME. Repeatable.")
@click.option("--text-field", default="text", show_default=True, help="JSONL/dataset text field.")
@click.option("--tokens", type=click.IntRange(min=1), default=None,
              help="Token budget [default: 30000, OSCAR's].")
@click.option("--seq-len", type=click.IntRange(min=2), default=None, help="Tokens per window [default: 2048].")
@click.option("--batch-size", type=click.IntRange(min=1), default=None,
              help="Windows per forward pass [default: 1 on a CPU, 32K tokens' worth on a GPU].")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Picks which windows of the text are calibrated on (and held out for the clip "
                   "search) and the clip search's query positions.")
@click.option("--revision", help="Model revision (branch, tag or commit) when loading from a hub.")
@click.option("--k-objective", type=click.Choice(["qqt", "ktk", "hadamard"]), default="qqt", show_default=True)
@click.option("--v-objective", type=click.Choice(["sst", "vtv", "hadamard"]), default="sst", show_default=True)
@click.option("--composition", type=click.Choice(["r_h_pbr", "r_h", "pbr", "plain"]), default="r_h_pbr",
              show_default=True)
@click.option("--granularity", type=click.Choice(["layer", "kv_head"]), default="layer", show_default=True,
              help="One rotation per layer (OSCAR format 1) or per KV head (format 2).")
@click.option("--key-centering/--no-key-centering", default=True, show_default=True,
              help="Subtract the mean post-RoPE key per (layer, KV head) before rotating.")
@click.option("--clip-search/--no-clip-search", default=True, show_default=True,
              help="Search clip ratios per layer; off = OSCAR's shipped K 0.96 / V 0.92.")
@click.option("--clip-per-head", is_flag=True, help="Search clip ratios per KV head too.")
@click.option("--group-size", type=click.IntRange(min=1),
              help="INT2 quantization group [default: the model's, at most head_dim].")
@click.option("--scale-dtype", type=click.Choice(["float32", "float16", "bfloat16"]), default="float32",
              show_default=True, help="Scale/zero dtype of the INT2 cache (SGLang's default is float32).")
@click.option("--lloyd-max/--uniform", "lloyd_max", default=None,
              help="INT2 buckets to simulate (clip search, validation) and record for serving: "
                   "Lloyd-Max, as SGLANG_LLOYD_MAX=1 (needs group size = head_dim), or uniform "
                   "min/max [default: how OSCAR serves the model, from the catalog].")
@click.option("--validate/--no-validate", "run_validation", default=False, show_default=True,
              help="Validate the bundle on held-out text right after calibrating (exit 1 if it fails).")
@click.option("--overwrite", is_flag=True, help="Replace an existing bundle at --out.")
@json_option
def calibrate_command(model, out, data, text_field, tokens, seq_len, batch_size, seed, revision,
                      k_objective, v_objective, composition, granularity, key_centering, clip_search,
                      clip_per_head, group_size, scale_dtype, lloyd_max, run_validation, overwrite,
                      as_json):
    """Calibrate MODEL (catalog name, hub id, local dir or .gguf) into a rotation bundle."""
    _refuse_an_out_in_the_cache(out)
    if out.exists() and not overwrite:
        raise click.UsageError(f"{out} exists; pass --overwrite to replace it")
    if out.exists() and not (out / "bundle.json").is_file():
        # the write swaps the whole directory out: a typo'd --out would lose its files
        raise click.UsageError(f"{out} exists and is not a bundle (no bundle.json in it); "
                               "--overwrite replaces only a bundle: choose another --out")
    from oscar_zoo.calibrate.data import BUILTIN, load_text
    from oscar_zoo.calibrate.jobspec import check_int2_geometry, int2_defaults
    from oscar_zoo.calibrate.pipeline import CalibrationConfig, calibrate
    from oscar_zoo.calibrate.validate import ValidationConfig

    from .. import bundle as bundle_mod

    src = _resolve(model, revision)
    int2 = int2_defaults(src.entry)  # the cache OSCAR serves this model with, as a job would
    cfg = CalibrationConfig(
        model=model, revision=revision, data=list(data) or [BUILTIN], text_field=text_field,
        tokens=tokens if tokens is not None else settings.get("calib_tokens"),
        seq_len=seq_len if seq_len is not None else settings.get("calib_seq_len"),
        batch_size=batch_size, seed=seed, k_objective=k_objective, v_objective=v_objective,
        composition=composition, granularity=granularity, key_centering=key_centering,
        clip_search=clip_search, clip_per_head=clip_per_head, scale_dtype=scale_dtype,
        group_size=group_size or int2.get("group_size"), sink_tokens=int2["sink_tokens"],
        recent_tokens=int2["recent_tokens"],
        lloyd_max=int2["lloyd_max"] if lloyd_max is None else lloyd_max)
    _check_clip_windows(cfg, src)
    cfg.check()  # before a load: a bad length must not cost one
    if src.entry is not None:   # a catalog model's geometry is known: a bad group costs no load
        check_int2_geometry(cfg.group_size, src.entry.geometry, lloyd_max=cfg.lloyd_max)
    if run_validation:
        ValidationConfig().check(cfg.sink_tokens, cfg.recent_tokens)
    _note_whole_windows(cfg.tokens, cfg.seq_len)
    text = load_text(cfg.data, "calibration", cfg.text_field)   # bad --data must not cost a load
    _check_writable(out)
    bars = PhaseBars()
    t0 = time.perf_counter()
    loaded = _load(src, bars) if run_validation else None  # one load for both steps
    load_s = time.perf_counter() - t0
    result = calibrate(cfg, progress=bars, loaded=loaded, text=text)
    for phase in ("loading", "total"):  # calibrate() times a load only when it does it
        result.timings[phase] = result.timings.get(phase, 0.0) + load_s
    bars.close()
    written = _write_calibration(result.bundle, out, overwrite, run_validation)
    info(f"wrote {out} ({result.tokens_per_pass:,} tokens per pass, {result.timings['total']:.1f} s)")
    if run_validation:  # after the write: a failure here keeps the calibration
        bundle = _validate_in_place(result.bundle, loaded, bars)
        bars.close()
        with out_of_space(f"--out {out}", "storing the validation report in the bundle", "the "
                          "calibrated bundle there is kept as it was, without the report. To "
                          f"fix: free space on that disk, then run `oscar-zoo validate {out}`",
                          out):
            written = bundle_mod.write(bundle, out, overwrite=True)
        info(f"validation report stored in {out}/bundle.json")
    data_out = {**bundle_mod.summary(written.manifest), "path": str(out),
                "timings_s": {k: round(v, 3) for k, v in result.timings.items()}}
    emit(data_out, as_json, _human)
    if run_validation:
        _exit_unless_passed(written.manifest.validation, out)


def _note_whole_windows(tokens: int, seq_len: int) -> None:
    """Warn when the budget is not whole windows: calibrate/data.token_windows takes whole_windows,
    ceil(tokens / seq_len), so --tokens 10 --seq-len 400 calibrated on 400 tokens
    without a word, and the manifest's calibration.tokens disagreed with the budget asked.
    Quiet for the shipped defaults (30000 in windows of 2048: 720 more), OSCAR's own recipe,
    which every run would otherwise warn about."""
    from oscar_zoo.calibrate.data import whole_windows

    windows = whole_windows(tokens, seq_len)
    total = windows * seq_len
    shipped = tuple(int(settings.setting(n).default) for n in ("calib_tokens", "calib_seq_len"))
    if total == tokens or (tokens, seq_len) == shipped:
        return
    lower = tokens // seq_len * seq_len
    choose = (f"For a whole number of windows, pass --tokens {lower} or {total}, or another "
              "--seq-len" if lower else "For fewer, pass a shorter --seq-len")
    warn(f"a budget of {tokens:,} tokens (--tokens) is rounded up to {windows} whole "
         f"window{'s' if windows != 1 else ''} of {seq_len:,} tokens (--seq-len): calibrating on "
         f"{total:,} tokens, {total - tokens:,} more. {choose}")


def _cache_holding(path: Path, but_rescued: bool = False):
    """The oscar-zoo Cache whose directory holds `path`, else None. Links are followed: a link
    to a snapshot, or a linked directory above one, reaches the very files `pull` keeps. With
    `but_rescued`, the cache's rescued/ dir counts as outside: what calibrate saved there is the
    user's own bundle, not one the cache holds by its digest (and calibrate's rescue message
    says to `oscar-zoo validate` it there)."""
    from ..cache import Cache
    from ..errors import ConfigError

    try:
        cache = Cache()
    except ConfigError:     # a bad OSCAR_ZOO_CACHE: there is no cache to keep safe
        return None
    real = path.resolve()
    if but_rescued and real.is_relative_to(cache.rescued.resolve()):
        return None
    return cache if real.is_relative_to(cache.root.resolve()) else None


def _refuse_an_out_in_the_cache(out: Path) -> None:
    """Before the calibration: `--out <a snapshot> --overwrite` swapped a pulled version out for
    the new bundle, which no longer matched its digest (the next `oscar-zoo verify` deleted it),
    and any other dir there is one the cache's commands own, not the user's."""
    from ..errors import InvalidInput

    cache = _cache_holding(out)
    if cache is not None:
        raise InvalidInput(f"--out {out} is in the oscar-zoo cache ({cache.root}), whose "
                           "directories pull, verify and prune own: a bundle written over a "
                           "snapshot no longer matches its digest, and the next `oscar-zoo "
                           "verify` deletes it. Choose an --out outside the cache")


def _refuse_to_write_into_the_cache(bundle_dir: Path) -> None:
    """Before any work (validation takes minutes): storing the report in a snapshot `pull` made
    rewrote it, its bundle.json no longer hashed to its digest, and the next `oscar-zoo verify`
    deleted the whole version, the report with it. A copy, or --no-write, leaves it intact."""
    from ..errors import InvalidInput

    cache = _cache_holding(bundle_dir, but_rescued=True)
    if cache is not None:
        raise InvalidInput(
            f"{bundle_dir} is a bundle in the oscar-zoo cache ({cache.root}): storing the report "
            "there would rewrite the cache's copy, which then no longer matches its digest, and "
            "the next `oscar-zoo verify` deletes it, report and all. Validate a copy instead: "
            f"`oscar-zoo export {shlex.quote(str(bundle_dir))} --format safetensors --out DIR`, "
            "then `oscar-zoo validate DIR`; or pass --no-write to only print the report")


def _resolve(model: str, revision: str | None = None):
    """resolve_source, with the "Did you mean" of `show`, `pull` and `convert` for a name that is
    close to a catalog model's (smollm-135m: smollm2-135m)."""
    from oscar_zoo.calibrate.jobspec import is_path
    from oscar_zoo.calibrate.loading import resolve_source

    from ..catalog import suggest
    from ..errors import ModelNotFound

    try:
        return resolve_source(model, revision)
    except ModelNotFound as e:
        close = [] if e.suggestions or is_path(model) or Path(model).exists() else suggest(model)
        if not close:
            raise
        raise ModelNotFound(str(e), suggestions=close) from None


def _check_clip_windows(cfg, src) -> None:
    """The check a job spec gets of the clip search's windows, in this command's terms: the
    BF16 sink + recent windows are how OSCAR serves the model (the catalog's), not an option of
    calibrate, so the ways out are a longer --seq-len or no clip search. Before cfg.check(),
    which would name a job spec's fields."""
    from oscar_zoo.calibrate.jobspec import check_clip_windows

    if not cfg.clip_search:
        return
    served = (f"how OSCAR serves {src.entry.name}" if src.entry is not None
              else "OSCAR's defaults for a model outside its catalog")
    check_clip_windows(cfg.seq_len, cfg.sink_tokens, cfg.recent_tokens, seq_len_name="--seq-len",
                       windows_from=served,
                       clip_search_off=f"pass --no-clip-search to keep OSCAR's shipped clips "
                                       f"(K {cfg.k_clip:g} / V {cfg.v_clip:g})")


def _write_calibration(bundle, out: Path, overwrite: bool, validating: bool):
    """Write the calibrated bundle at --out. Hours of GPU work end here: when --out's disk (or
    quota) is full, the bundle is saved elsewhere (_rescue), and the error says where, or that
    it could not be."""
    from .. import bundle as bundle_mod
    from ..errors import StorageFull, is_no_space

    try:
        return bundle_mod.write(bundle, out, overwrite=overwrite)
    except OSError as e:
        if not is_no_space(e):
            raise
        full = e
    said = (f"out of disk space in --out {out} ({full.strerror or os.strerror(full.errno)}) "
            "while writing the calibrated bundle; nothing half-written was kept there")
    saved, failures = _rescue(bundle, out)
    if saved is not None:
        said += (f". The calibration is not lost: it was saved to {saved} instead; move it "
                 f"where it belongs (`mv {saved} DIR`), or free space on that disk and move it "
                 "to --out")
        if _in_the_cache(saved):
            said += (f". Until then `oscar-zoo cache ls` lists it under RESCUED, and `oscar-zoo "
                     f"cache rm --rescued {saved.parent.name}` removes it")
        if validating:
            said += f"; it was not validated: run `oscar-zoo validate {saved}`"
    else:
        said += (f"; saving it elsewhere failed too ({'; '.join(failures)}), so the calibration "
                 "is lost. To fix: free space on that disk, or choose another --out, and "
                 "calibrate again")
    raise StorageFull(said, full.errno, str(out)) from full


def _rescue(bundle, out: Path) -> tuple[Path | None, list[str]]:
    """Write the bundle under the first of _rescue_roots that takes it: (its path, or None;
    why each root before it failed). A root on --out's own disk is tried too: a quota or a
    project quota may cover --out's directory only."""
    failures = []
    for root, prefix, guard in _rescue_roots():
        try:
            # the cache itself first: gc_guard holds no lock on a cache that does not exist
            root.parent.mkdir(parents=True, exist_ok=True)
            # held from before its dir is made to the bundle's last file: `cache rm --rescued`
            # never meets it half-written, nor removes rescued/ between its mkdir and ours
            with guard():
                root.mkdir(exist_ok=True)
                return _rescue_into(bundle, root, prefix, out.name or "bundle"), failures
        except OSError as e:
            failures.append(f"{root}: {e.strerror or e}")
    return None, failures


def _rescue_into(bundle, root: Path, prefix: str, name: str) -> Path:
    """The bundle written at root/<prefix><UTC time>-<random>/<name>; OSError with nothing of
    it left behind."""
    import shutil
    import tempfile

    from .. import bundle as bundle_mod

    # a new dir of our own (0700), never one another user of a shared temp dir made; its name
    # in UTC, as `oscar-zoo cache ls` shows the time it was saved
    made = Path(tempfile.mkdtemp(prefix=time.strftime(f"{prefix}%Y%m%d-%H%M%SZ-", time.gmtime()),
                                 dir=root))
    try:
        saved = made / name
        bundle_mod.write(bundle, saved)
        return saved
    except OSError:
        shutil.rmtree(made, ignore_errors=True)
        raise


def _rescue_roots() -> list[tuple[Path, str, Callable[[], ContextManager]]]:
    """Where a calibration goes when --out is full, the prefix of its dir there, and what to
    hold while writing it: the cache's rescued/ dir, which prune and a `cache rm` of models
    leave alone and `cache rm --rescued` removes (not its tmp/, which prune empties of what is
    an hour old), then the system's temp dir (often RAM, emptied at reboot: better than
    nothing)."""
    import tempfile
    from contextlib import nullcontext
    from functools import partial

    from ..cache import Cache
    from ..errors import ConfigError

    roots = []
    try:
        cache = Cache()
        roots.append((cache.rescued, "calibrate-", partial(_kept_from_cache_rm, cache)))
    except ConfigError:     # a bad OSCAR_ZOO_CACHE: the temp dir may still take it
        pass
    roots.append((Path(tempfile.gettempdir()), "oscar-zoo-calibrate-", nullcontext))
    return roots


@contextmanager
def _kept_from_cache_rm(cache) -> Iterator[None]:
    """The cache's gc.lock held shared, as a pull holds it: `cache rm --rescued` holds it
    exclusively, so it waits for the bundle to be whole rather than remove it half-written.
    Not had within lock_timeout (a long prune or cache rm holds it): the bundle is written all
    the same, as hours of calibration lost are worse than a rescue a `cache rm --rescued`
    started meanwhile might meet half-written."""
    from ..errors import LockTimeout

    with ExitStack() as held:
        try:
            held.enter_context(cache.gc_guard())
        except LockTimeout as e:
            warn(f"could not lock the cache to save the calibration there ({e}); saving it "
                 "anyway: run no `oscar-zoo cache rm --rescued` until this calibrate has ended")
        yield


def _in_the_cache(saved: Path) -> bool:
    """Whether _rescue saved it under the cache's rescued/ dir (else the temp dir)."""
    from ..cache import Cache
    from ..errors import ConfigError

    try:
        return saved.parent.parent == Cache().rescued
    except ConfigError:
        return False


def _check_writable(out: Path) -> None:
    """The bundle is written after the calibration: an --out that cannot be written (a file
    in its path, a read-only or full disk) must fail now, not after the passes."""
    from ..files import staging_dir

    try:
        with staging_dir(out):   # what the write makes first (and removes unless renamed)
            pass
    except OSError as e:
        raise click.UsageError(f"--out {out}: cannot write a bundle there ({e.strerror or e}); "
                               "choose a writable directory") from None


def _load(src, bars):
    from oscar_zoo.calibrate.loading import load_model

    bars(phase="loading", done=0, total=1)
    loaded = load_model(src)
    bars(phase="loading", done=1, total=1)   # else its bar stays at 0% once closed
    return loaded


def _validate_in_place(bundle, loaded, bars):
    from oscar_zoo.calibrate.validate import ValidationConfig, validate

    model, tok = loaded
    report = validate(bundle, model, tok, ValidationConfig(), _quantizer(bundle, model), progress=bars)
    bundle.manifest = bundle.manifest.model_copy(update={"validation": report})
    return bundle


def _quantizer(bundle, model):
    """The INT2 the bundle is served with: its scale dtype, Lloyd-Max buckets where it says so."""
    from oscar_zoo.calibrate.int2_attention import bundle_quantizer

    return bundle_quantizer(bundle.manifest, model.device)


def _human(d: dict) -> str:
    clip = d["clip"]
    lines = [f"bundle      {d['path']}",
             f"model       {d['model']} ({d['hub_id']}): {d['layers']} layers x {d['kv_heads']} KV heads, d={d['head_dim']}",
             f"method      {d['method']}; key centering {'on' if d['key_centering'] else 'off'}",
             _clip_line(clip),
             "timings     " + ", ".join(f"{k} {v:.1f}s" for k, v in d["timings_s"].items())]
    if d.get("validated") is not None:
        lines.append(f"validated   {'passed' if d['validated'] else 'FAILED'}")
    return "\n".join(lines)


def _clip_line(clip: dict) -> str:
    """Searched: the best single pair the search found. Not: the fixed default pair, which no
    search chose (it said "best single pair (fixed)" after --no-clip-search)."""
    pair = f"K {clip['k']:g} / V {clip['v']:g}"
    if clip["searched"]:
        return f"clip        {pair} best single pair (searched per {clip['granularity']})"
    return f"clip        {pair}: the fixed default pair (--no-clip-search)"


@click.command("validate")
@click.argument("bundle_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--model", help="Model to run (default: the bundle's own, e.g. its catalog name).")
@click.option("--data", "data", multiple=True, help="Held-out text (default: builtin:pydoc, held-out half).")
@click.option("--text-field", default="text", show_default=True, help="JSONL/dataset text field.")
@click.option("--context-len", type=int, default=2048, show_default=True,
              help="Tokens per evaluation window: the context the INT2 cache is measured at "
                   "(must exceed the bundle's BF16 sink + recent tokens).")
@click.option("--windows", type=int, default=6, show_default=True,
              help="Evaluation windows of --context-len tokens, split alternately into two sets "
                   "for a noise estimate. Each costs a forward in BF16 and one per variant: "
                   "fewer is faster.")
@click.option("--tolerance", type=click.FloatRange(min=0), default=0.05, show_default=True,
              help="Nats/token the bundle may lose to the Hadamard baseline and still pass.")
@click.option("--write/--no-write", "write_back", default=True, show_default=True,
              help="Store the report in the bundle's manifest (rewritten atomically). A "
                   "bundle in the oscar-zoo cache is never rewritten: pass --no-write for it.")
@json_option
def validate_command(bundle_dir, model, data, text_field, context_len, windows, tolerance,
                     write_back, as_json):
    """Measure a bundle's INT2 quality on held-out text beside Hadamard and naive INT2.

    Exits 1 when the bundle does not pass (the report is still printed and stored).
    A bundle in the oscar-zoo cache is validated with --no-write only: validate a copy
    (`oscar-zoo export DIR --format safetensors --out COPY`) to store its report."""
    from oscar_zoo.calibrate.loading import load_model
    from oscar_zoo.calibrate.validate import (ValidationConfig, check_geometry_of, held_out_text,
                                              validate)

    from .. import bundle as bundle_mod

    if write_back:
        _refuse_to_write_into_the_cache(bundle_dir)
    bundle = bundle_mod.read(bundle_dir)
    cfg = ValidationConfig(data=list(data) or ValidationConfig().data, text_field=text_field,
                           context_len=context_len, windows=windows, tolerance=tolerance)
    q = bundle.manifest.quantization
    cfg.check(q.sink_tokens, q.recent_tokens)  # before the load
    text = held_out_text(bundle, cfg)          # and the text: bad --data must not cost a load
    src = _bundle_model(bundle.manifest.model, model)
    if src.entry is not None and src.entry.geometry_verified:   # known: a wrong --model costs no load
        check_geometry_of(bundle, src.entry.geometry)
    _check_kv_shared_before_loading(bundle, src)
    loaded = load_model(src)
    bars = PhaseBars()
    report = validate(bundle, *loaded, cfg, _quantizer(bundle, loaded[0]), progress=bars, text=text)
    bars.close()
    if write_back:
        bundle.manifest = bundle.manifest.model_copy(update={"validation": report})
        bundle_mod.write(bundle, bundle_dir, overwrite=True)
        info(f"report stored in {bundle_dir}/bundle.json")
    emit(report.model_dump(mode="json"), as_json, _human_report)
    _exit_unless_passed(report, bundle_dir)


def _check_kv_shared_before_loading(bundle, src) -> None:
    """validate()'s KV-shared check (check_kv_shared_tensors), made before the load where the
    model's config.json is on disk: a model directory, or a hub model in the Hugging Face
    cache. Elsewhere reading it costs a download; validate() makes the check after the load,
    before any forward."""
    from oscar_zoo.calibrate.cache_bits import check_kv_shared_tensors, kv_sources

    path = _config_on_disk(src)
    try:
        config = json.loads(path.read_text()) if path is not None else None
    except (OSError, ValueError):
        return              # the load says what is wrong with it
    if isinstance(config, dict):
        check_kv_shared_tensors(bundle, kv_sources(config))


def _config_on_disk(src) -> Path | None:
    if src.gguf_file is not None:        # its config is in the GGUF's metadata
        return None
    local = Path(src.path) / "config.json"
    if local.is_file():
        return local
    from huggingface_hub import try_to_load_from_cache

    try:        # the cache only: never the network
        cached = try_to_load_from_cache(src.path, "config.json", revision=src.revision)
    except ValueError:      # a name the hub's rules refuse (HFValidationError): the load names it
        return None
    return Path(cached) if isinstance(cached, str) else None


def _exit_unless_passed(report, where) -> None:
    """Exit 1 on a failed validation, so that `validate B && publish B` stops there."""
    if not report.passed:
        warn(f"{where}: validation failed ({report.criterion}); exit status 1")
        sys.exit(1)


def _bundle_model(ref, model: str | None):
    """--model, else the bundle's own model at the revision it was calibrated on."""
    from oscar_zoo.calibrate.loading import resolve_source

    from ..errors import ModelNotFound

    if model:
        return _resolve(model)
    try:
        return resolve_source(ref.name, ref.revision)
    except ModelNotFound:
        raise ModelNotFound(f"the bundle's model {ref.name!r} is neither in the catalog nor a hub "
                            "id; pass --model with the directory or .gguf it was calibrated "
                            "from") from None


# what validation simulated; reports from before the field existed all measured uniform INT2
_QUANTIZERS = {"uniform": "uniform INT2", "lloyd_max": "Lloyd-Max INT2 buckets"}


def _human_report(r: dict) -> str:
    quantizer = r.get("quantizer") or "uniform"
    # a cache with sliding-window layers is not context_len tokens in every layer: said, as
    # it is what raises the whole cache's bits
    windowed = window_note(r)
    # bits per stored K/V element: what each figure counts is said beside it (rotations and the
    # key mean are per layer, the same whatever the length: no per-token cost)
    lines = [f"context {r['context_len']} (sink {r['sink_tokens']}, recent {r['recent_tokens']}, "
             f"group {r['group_size']}, {r['scale_dtype']} scales, {_QUANTIZERS.get(quantizer, quantizer)}), "
             f"{r['eval_tokens']:,} tokens of {r['dataset']}",
             f"cache bits {r['bits_int2_tier']:.2f} per K/V element in the INT2 tier (2-bit codes + "
             f"{r['scale_dtype']} scale and zero per {r['group_size']} elements); "
             f"{r['bits_at_context']:.2f} per element of a whole {r['context_len']}-token cache"
             + (f" ({windowed})" if windowed else "") + ", "
             f"its BF16 sink {r['sink_tokens']} + recent {r['recent_tokens']} included "
             "(rotations and key mean: per layer, not counted)",
             f"BF16 loss {r['bf16_nll']:.4f} nats/token", "",
             f"{'variant':15} {'extra loss':>11} {'set A':>9} {'set B':>9} {'KL':>8} {'attn err':>9}"]
    for v in r["variants"]:
        # "-" for a set not measured (--windows 1 makes one): it printed +nan
        sets = ([f"{x:+9.4f}" for x in v["delta_nll_by_set"]] + [f"{'-':>9}"] * 2)[:2]
        lines.append(f"{v['name']:15} {v['delta_nll']:+11.4f} {sets[0]} {sets[1]} "
                     f"{v['kl']:8.4f} {v['attn_rel_error']:9.3f}")
    lines += ["", f"{'PASSED' if r['passed'] else 'FAILED'}: {r['criterion']}"]
    return "\n".join(lines)


def register(cli: click.Group) -> None:
    cli.add_command(calibrate_command)
    cli.add_command(validate_command)
