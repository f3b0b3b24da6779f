"""The job runner: spec -> load -> calibrate -> validate -> bundle on disk. Runs in a child
process of a worker (calibrate/executors/worker.py), which does all the talking to the registry:

    python -P -m oscar_zoo.calibrate.runner JOB.json OUT_DIR

JOB.json is {"id", "spec"}. Events go to stdout as JSON lines ({"event": "progress", phase,
done, total, layer, ...}, then one of done | error | cancelled); anything else the libraries
print goes to stderr. An error's one line (`error`) becomes the job's public error; its
`traceback`, which names the host's paths, goes to the worker's log only. SIGTERM asks for a
stop: it is honoured at the next progress step (between layers), so the process exits on its
own and its GPU memory goes with it.

Exit codes: 0 done, 1 error worth retrying (I/O, CUDA), 2 error a retry would repeat, 3 cancelled.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Callable

from oscar_zoo.zoo.errors import InvalidInput, JobCancelled, ModelNotFound, OscarZooError

from . import jobspec

Emit = Callable[..., None]


def calibration_config(spec: jobspec.JobSpec):
    from .pipeline import CalibrationConfig

    keys = ("model", "revision", "data", "text_field", "tokens", "seq_len", "batch_size", "seed",
            "k_objective", "v_objective", "composition", "granularity", "key_centering",
            "clip_search", "clip_per_head", "clip_windows", "clip_queries", "k_clip", "v_clip",
            "group_size", "scale_dtype", "sink_tokens", "recent_tokens")
    # A spec stored before lloyd_max existed (None) ran uniform INT2, and still does.
    return CalibrationConfig(**{k: getattr(spec, k) for k in keys}, lloyd_max=bool(spec.lloyd_max))


def validation_config(spec: jobspec.JobSpec):
    from .validate import ValidationConfig

    v = spec.validation
    return ValidationConfig(data=list(v.data), text_field=spec.text_field,
                            context_len=v.context_len, windows=v.windows, tolerance=v.tolerance)


def stamp(manifest, job: dict, spec: jobspec.JobSpec):
    """The job's spec (verbatim, defaults filled) and id in the manifest; the model named as
    the registry knows it (`publish_as` for a path), at the revision the calibration loaded
    (the commit it resolved; the spec keeps the revision asked for)."""
    from oscar_zoo.zoo.manifest import ModelRef

    name, hub_id, _ = jobspec.identity(spec)
    model = ModelRef(name=name, hub_id=hub_id, revision=manifest.model.revision or spec.revision,
                     architecture=manifest.model.architecture)
    calibration = manifest.calibration.model_copy(update={"spec": job["spec"], "job_id": job["id"]})
    return manifest.model_copy(update={"model": model, "calibration": calibration})


def check_files(spec: jobspec.JobSpec) -> None:
    """The spec's model and data files, again on the host that runs it, before the model loads:
    submit checks only where they are (jobspec.check_paths), and a file may vanish or lose its
    permissions while the job waits. An unreadable data file was an OSError, retried on every
    attempt; a model directory's missing or unreadable weights failed deep inside the load.
    Raises ModelNotFound or InvalidInput, which are not retried: every attempt would meet the
    same file."""
    import socket

    host = socket.gethostname()
    if jobspec.is_path(spec.model):
        _check_readable(spec.model, "model path", host, ModelNotFound)
    held_out = spec.validation.data if spec.validation.enabled else []
    for data in jobspec.data_files((*spec.data, *held_out)):
        _check_readable(data, "data file", host, InvalidInput)


def _check_readable(given: str, what: str, host: str, error: type[OscarZooError]) -> None:
    path = Path(given).expanduser()
    fix = "give a path every worker can read"
    if not path.exists():
        raise error(f"{what} {given} does not exist on worker host {host}; {fix}")
    for f in _with_entries(path):
        problem = _unreadable(f)
        if problem:
            raise error(f"{what} {given} on worker host {host}: {problem}; {fix}")


def _with_entries(path: Path):
    """The path, then a directory's entries (the loader's files; not hidden ones such as .git or
    .cache, which it never reads), listed only once the directory itself passed."""
    yield path
    if path.is_dir():
        yield from sorted(f for f in path.iterdir() if not f.name.startswith("."))


def _unreadable(f: Path) -> str | None:
    if not f.exists():       # a symlink whose target is gone (a pruned Hugging Face cache)
        return f"{f.name} links to a file that no longer exists (restore it)"
    if not os.access(f, os.R_OK | (os.X_OK if f.is_dir() else 0)):
        return f"{f} is not readable by the workers' user (make it readable: chmod, chown)"
    return None


def run(job: dict, out_dir: Path, emit: Emit, cancelled: Callable[[], bool]) -> dict:
    """The whole job short of publishing; returns what the `done` event carries."""
    from oscar_zoo.zoo.bundle import write

    from .data import load_text
    from .int2_attention import bundle_quantizer
    from .loading import load_model, resolve_source
    from .pipeline import calibrate
    from .validate import eval_windows, validate

    spec = jobspec.parse_spec(job["spec"])
    jobspec.identity(spec)      # what stamp() needs: refused now, not after the calibration
    check_files(spec)

    def progress(phase: str, done: int = 0, total: int = 0, layer: int | None = None, **extra):
        if cancelled():
            raise JobCancelled(f"job {job['id']} was cancelled during {phase}")
        emit("progress", phase=phase, done=done, total=total, layer=layer, **extra)

    # before the load: a missing file or a JSON line without the text field must not cost one
    # errors name the spec's fields, which the job's owner changes, not the CLI's options
    terms = jobspec.DATA_TERMS
    text = load_text(spec.data, "calibration", spec.text_field, terms=terms)
    vcfg = validation_config(spec) if spec.validation.enabled else None
    held_text = (load_text(vcfg.data, "heldout", vcfg.text_field, terms=terms)
                 if vcfg is not None else None)
    progress("loading", 0, 1)
    t0 = time.perf_counter()
    model, tok = load_model(resolve_source(spec.model, spec.revision))
    timings = {"loading": time.perf_counter() - t0}
    progress("loading", 1, 1)
    if vcfg is not None:     # too little held-out text would show only after calibrating
        held_out = eval_windows(tok, held_text, vcfg.context_len, vcfg.windows)
    result = calibrate(calibration_config(spec), progress=progress, loaded=(model, tok), text=text)
    timings.update({k: v for k, v in result.timings.items() if k not in ("loading", "total")})
    bundle = result.bundle
    bundle.manifest = stamp(bundle.manifest, job, spec)
    report = None
    if vcfg is not None:
        t = time.perf_counter()
        quantizer = bundle_quantizer(bundle.manifest)   # as the bundle is served (Lloyd-Max or uniform)
        report = validate(bundle, model, tok, vcfg, quantizer, progress=progress, held_out=held_out)
        timings["validating"] = time.perf_counter() - t
        bundle.manifest = bundle.manifest.model_copy(update={"validation": report})
    written = write(bundle, out_dir / "bundle", overwrite=True)
    return {"bundle_dir": str(out_dir / "bundle"), "digest": written.digest,
            "timings": {k: round(v, 3) for k, v in timings.items()},
            "tokens_per_pass": result.tokens_per_pass,
            "validation_passed": None if report is None else report.passed,
            "criterion": None if report is None else report.criterion}


def _is_oom(e: BaseException) -> bool:
    return isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError"


def _summary(limit: int = 12) -> str:
    lines = traceback.format_exc().rstrip().splitlines()
    return "\n".join(lines[:1] + lines[-limit:]) if len(lines) > limit + 1 else "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    job_file, out_dir = (argv if argv is not None else sys.argv[1:])[:2]
    events = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)                      # stray prints from libraries go to the log, not the events
    stop = {"asked": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(asked=True))
    parent = os.getppid()

    def emit(kind: str, **data) -> None:
        events.write(json.dumps({"event": kind, **data}, default=float) + "\n")

    def cancelled() -> bool:
        return stop["asked"] or os.getppid() != parent

    job = json.loads(Path(job_file).read_text())
    try:
        emit("done", **run(job, Path(out_dir), emit, cancelled))
        return 0
    except JobCancelled:
        emit("cancelled")
        return 3
    except OscarZooError as e:
        emit("error", error=f"{type(e).__name__}: {e}", traceback=_summary(), retryable=False)
        return 2
    except Exception as e:  # noqa: BLE001 - reported to the registry, its traceback logged
        if _is_oom(e):
            emit("error", error="out of memory: lower tokens, seq_len or batch_size (calibration) "
                 "or validation.context_len, or give the job more GPUs (gpus)",
                 traceback=_summary(), retryable=False)
            return 2
        # I/O and runtime (CUDA, network) errors may pass on another attempt or host; a
        # ValueError or KeyError would only repeat.
        retry = isinstance(e, (OSError, RuntimeError))
        emit("error", error=f"{type(e).__name__}: {e}", traceback=_summary(), retryable=retry)
        return 1 if retry else 2


if __name__ == "__main__":
    sys.exit(main())
