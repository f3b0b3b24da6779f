"""`oscar-zoo jobs submit|status|watch|cancel|list`: calibration jobs on a registry
(OSCAR_ZOO_ENDPOINT; submit and cancel need a token with scope jobs:submit, and cancel the
token that submitted the job or an admin token). A JOB_ID is the whole id or its first 8 or
more characters, as `jobs list` shows them (the registry resolves it; one that starts several
jobs' ids is refused, naming them)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import click

from ..errors import InvalidInput
from ..jobs_client import SHORT_ID, JobsClient
from .output import emit, info, json_option, warn

# The job spec's field (as the registry's refusals name it: body.tokens, body.validation.windows)
# that each option of `submit` sets, so that a refusal of what an option gave names the option
OPTION_OF = {"model": "MODEL", "revision": "--revision", "publish_as": "--publish-as",
             "data": "--data", "tokens": "--tokens", "seq_len": "--seq-len", "seed": "--seed",
             "granularity": "--granularity", "group_size": "--group-size",
             "clip_search": "--clip-search", "sink_tokens": "--sink-tokens",
             "recent_tokens": "--recent-tokens", "aliases": "--alias", "mirror": "--mirror",
             "gpus": "--gpus", "validation.context_len": "--context-len",
             "validation.windows": "--validation-windows", "validation.enabled": "--no-validation",
             "publish": "--draft"}


def _client():
    return JobsClient()


@click.group("jobs")
def jobs_group():
    """Calibration jobs: submit one, follow it, cancel it, list them."""


@jobs_group.command("submit")
@click.argument("model", required=False)
@click.option("--spec", "spec_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A JSON job spec; the options below override its fields.")
@click.option("--revision", help="Model revision (branch, tag or commit).")
@click.option("--publish-as", help="Catalog name or hub id to publish under (for a model path).")
@click.option("--data", "data", multiple=True,
              help="Calibration text: builtin:pydoc, a .txt/.jsonl path, hf:ORG/NAME[:CONFIG][@SPLIT].")
@click.option("--tokens", type=int, help="Token budget [default: 30000].")
@click.option("--seq-len", type=int, help="Tokens per window [default: 2048].")
@click.option("--seed", type=int)
@click.option("--granularity", type=click.Choice(["layer", "kv_head"]))
@click.option("--group-size", type=int)
@click.option("--clip-search/--no-clip-search", default=None)
@click.option("--sink-tokens", type=int)
@click.option("--recent-tokens", type=int)
@click.option("--context-len", type=int, help="Validation context length.")
@click.option("--validation-windows", type=int, help="Validation windows.")
@click.option("--no-validation", is_flag=True, help="Skip validation (the bundle is published as is).")
@click.option("--draft", is_flag=True, help="Keep the result as a draft instead of publishing it.")
@click.option("--alias", "aliases", multiple=True, help="Alias to point at the new version (repeat).")
@click.option("--mirror", "mirrors", multiple=True, help="Mirror target hf:ORG/REPO or modelscope:ORG/REPO.")
@click.option("--gpus", type=int, help="GPUs the job needs [default: the catalog's].")
@click.option("--idempotency-key", help="Same key, same job: resubmitting returns the first one (keys are each token's own).")
@click.option("--watch", is_flag=True, help="Follow the job until it ends.")
@json_option
def submit(model, spec_file, revision, publish_as, data, tokens, seq_len, seed, granularity,
           group_size, clip_search, sink_tokens, recent_tokens, context_len, validation_windows,
           no_validation, draft, aliases, mirrors, gpus, idempotency_key, watch, as_json):
    """Submit a calibration job for MODEL (catalog name, hub id, or a path the workers can read)."""
    spec = _read_spec(spec_file) if spec_file else {}
    flat = dict(model=model, revision=revision, publish_as=publish_as, data=list(data) or None,
                tokens=tokens, seq_len=seq_len, seed=seed, granularity=granularity,
                group_size=group_size, clip_search=clip_search, sink_tokens=sink_tokens,
                recent_tokens=recent_tokens, aliases=list(aliases) or None,
                mirror=list(mirrors) or None, gpus=gpus)
    given = {k: v for k, v in flat.items() if v is not None}   # by field: what options set
    spec.update(given)
    validation = dict(spec.get("validation") or {})
    for key, value in (("context_len", context_len), ("windows", validation_windows)):
        if value is not None:
            validation[key] = given[f"validation.{key}"] = value
    if no_validation:
        validation["enabled"] = given["validation.enabled"] = False
    if validation:
        spec["validation"] = validation
    if draft:
        spec["publish"] = given["publish"] = False
    if not spec.get("model"):
        raise click.UsageError("name a MODEL (or give --spec with a model)")
    with _client() as client:
        try:
            job, created = client.submit(spec, idempotency_key)
        except InvalidInput as e:
            raise _in_option_words(e, given) from None
        info(f"job {job['id']} {'submitted' if created else 'already submitted with this key'} "
             f"({job['model']}, {job['status']})")
        if job.get("waiting"):
            warn(f"job {job['id']} cannot start yet: {job['waiting']}")
        if watch:
            job = _watch(client, job["id"], as_json)
    emit(job, as_json, _human)
    if watch and job["status"] != "succeeded":
        raise SystemExit(1)


@jobs_group.command("status")
@click.argument("job_id")
@json_option
def status(job_id, as_json):
    """A job's phase, progress, attempts, timings, error and result.

    JOB_ID: the whole id, or its first 8 or more characters."""
    with _client() as client:
        emit(client.get(job_id), as_json, _human)


@jobs_group.command("watch")
@click.argument("job_id")
@json_option
def watch(job_id, as_json):
    """Follow a job with a live progress bar until it ends (exit 1 unless it succeeded).

    JOB_ID: the whole id, or its first 8 or more characters."""
    with _client() as client:
        job = _watch(client, job_id, as_json)
    emit(job, as_json, _human)
    if job["status"] != "succeeded":
        raise SystemExit(1)


@jobs_group.command("cancel")
@click.argument("job_id")
@json_option
def cancel(job_id, as_json):
    """Cancel a job: at once when queued; a running one stops at its next layer. Only the
    token that submitted the job, or an admin token, may.

    JOB_ID: the whole id, or its first 8 or more characters."""
    with _client() as client:
        job = client.cancel(job_id)
    info(f"job {job['id']}: {'cancel requested' if job['status'] == 'running' else job['status']}")
    emit(job, as_json, _human)


@jobs_group.command("list")
@click.option("--status", type=click.Choice(["queued", "running", "succeeded", "failed", "cancelled"]))
@click.option("--model", help="Only jobs for this model.")
@click.option("--limit", type=click.IntRange(1, 200), default=20, show_default=True)
@json_option
def list_jobs(status, model, limit, as_json):
    """Jobs, newest first (short ids: each names its job; --json has them whole)."""
    with _client() as client:
        page = client.list(status, model, limit)
    emit(page["items"], as_json, _human_list)


def _in_option_words(e: InvalidInput, given: dict) -> InvalidInput:
    """The registry's refusal as `submit`'s options say it: a field an option set named as the
    option the user typed (`--tokens: Input should be ...`, not `body.tokens: ...`; one of a
    field from --spec, or of no field, as the registry said it), and the ways out the job
    spec's checks offer in the options that take them (`pass --no-clip-search`, not `set
    clip_search false`)."""
    said = _fixes_in_option_words(_field_in_option_words(str(e), given), given)
    if said == str(e):
        return e
    worded = type(e)(said)
    worded.__dict__.update(e.__dict__)      # its suggestions, status, retry_after
    return worded


def _field_in_option_words(said: str, given: dict) -> str:
    m = re.search(r"\bbody\.([\w.]+): ", said)
    if m is None:
        return said
    field, _, index = m.group(1).rpartition(".")
    if not index.isdigit():             # a list's item is named by its index: data.1
        field, index = m.group(1), ""
    if field not in given or field not in OPTION_OF:
        return said
    shown = OPTION_OF[field]
    if index and isinstance(given[field], list) and int(index) < len(given[field]):
        shown += f" {given[field][int(index)]!r}"      # which of the repeated option's values
    return said[:m.start()] + f"{shown}: " + said[m.end():]


# Fields whose name in a refusal is their option's: only names no English word spells (seq_len,
# validation.context_len; `tokens` is also a unit), and no flag (`--no-validation false` says
# nothing); those are said as whole phrases (_fix_phrases).
_NAMED = {field: option for field, option in OPTION_OF.items()
          if re.search(r"[_.]", field) and field not in ("clip_search", "validation.enabled")}


def _fix_phrases() -> dict[str, tuple[str | None, str]]:
    """phrase -> (the field an option must have set for the words to be true, else None: an
    option the user may add whatever they passed; the options' words for it)."""
    from ...calibrate import jobspec     # torch-free, but not for `oscar-zoo --help`

    return {jobspec.WINDOWS_FROM: (None, "--sink-tokens and --recent-tokens"),
            jobspec.CLIP_SEARCH_OFF: (None, "pass --no-clip-search"),
            jobspec.CLIP_SEARCH_ON: (None, "pass --clip-search"),
            jobspec.PUBLISH_ON: ("publish", "drop --draft"),
            jobspec.DRAFT: ("publish", "--draft"),
            jobspec.NO_ALIASES: ("aliases", "leave --alias out"),
            **{field: (None, option) for field, option in _NAMED.items()}}


def _fixes_in_option_words(said: str, given: dict) -> str:
    """Undoing words (drop --draft, leave --alias out) only where an option set the field: from
    --spec, `publish: false` is not fixed by dropping a --draft nobody passed."""
    for phrase, (field, option) in _fix_phrases().items():
        if field is not None and field not in given:
            continue
        # whole words only, and never a `body.field` the registry kept for a --spec field
        said = re.sub(rf"(?<![\w.-]){re.escape(phrase)}(?![\w-])", lambda _: option, said)
    return said


def _read_spec(path: Path) -> dict:
    try:
        spec = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise click.BadParameter(f"{path} is not JSON ({e})", param_hint="--spec") from None
    if not isinstance(spec, dict):
        raise click.BadParameter(f"{path} must hold a JSON object of job fields, e.g. "
                                 '{"model": "qwen3-8b", "tokens": 30000}', param_hint="--spec")
    return spec


def _watch(client, job_id: str, as_json: bool) -> dict:
    from .calibrate_cmds import PhaseBars

    bars = PhaseBars(enabled=not as_json)
    job, seen, waiting = None, None, None
    for job in client.events(job_id):
        p = job.get("progress") or {}
        phase = job["phase"]
        if job["status"] == "running" and phase != "queued" and p.get("total"):
            extra = {k: p[k] for k in ("layer", "variant") if p.get(k) is not None}
            bars(phase, int(p.get("done") or 0), int(p.get("total") or 0), **extra)
        if job.get("waiting") and job["waiting"] != waiting and not as_json:
            warn(f"job {job['id']} cannot start yet: {job['waiting']}")
        waiting = job.get("waiting")
        key = (job["status"], job["attempts"])
        if key != seen and not as_json:
            bars.close()
            bars.phase = None          # a new attempt starts its bars afresh
            info(f"job {job['id']}: {job['status']} (attempt {job['attempts']}/"
                 f"{job['max_attempts']})"
                 + (f": {job['progress'].get('requeued')}" if p.get("requeued") else ""))
            seen = key
    bars.close()
    return client.get(job_id) if job is None else job


def _human(job: dict) -> str:
    p = job.get("progress") or {}
    lines = [f"job         {job['id']}",
             f"model       {job['model']}",
             f"status      {job['status']} (phase {job['phase']}, attempt {job['attempts']}/"
             f"{job['max_attempts']}{', cancel requested' if job.get('cancel_requested') else ''})"]
    if job.get("waiting"):
        lines.append(f"waiting     {job['waiting']}")
    if job["status"] == "running":
        where = f" layer {p['layer']}" if p.get("layer") is not None else ""
        lines.append(f"progress    {p.get('done', 0)}/{p.get('total', 0)}{where}")
    if job.get("timings"):
        lines.append("timings     " + ", ".join(f"{k} {v:.1f}s" for k, v in job["timings"].items()))
    if p.get("tokens_per_pass"):
        rates = [f"{k.split('_')[0]} {p[k]:,.0f} tok/s" for k in ("pass1_tokens_per_s", "pass2_tokens_per_s") if p.get(k)]
        lines.append(f"tokens      {p['tokens_per_pass']:,} per pass" + (f" ({', '.join(rates)})" if rates else ""))
    r = job.get("result")
    if r:
        passed = {True: "validation passed", False: "validation FAILED", None: "not validated"}[r["validation_passed"]]
        lines.append(f"result      {r['model']} version {r['version']} ({r['status']}, {passed})")
    if job.get("error"):
        lines.append(f"error       {job['error']}")
    return "\n".join(lines)


def _human_list(items: list[dict]) -> str:
    if not items:
        return "no jobs"
    rows = [f"{'id':{SHORT_ID}}  {'status':9}  {'phase':11}  {'model':24}  {'att':>3}  version  "
            "created"]
    for j in items:
        rows.append(f"{j['id'][:SHORT_ID]:{SHORT_ID}}  {j['status']:9}  {j['phase'] or '':11}  "
                    f"{j['model'] or '':24}  {j['attempts']:>3}  "
                    f"{str(j['result_version'] or '-'):>7}  {j['created_at'][:19]}")
    return "\n".join(rows)


def register(cli: click.Group) -> None:
    cli.add_command(jobs_group)
