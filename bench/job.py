"""One calibration job end to end through the product: `oscar-zoo serve` (SQLite, its local
worker on whatever device is here), a token, a job submitted over REST, followed to the end;
prints the phase timings and tokens/s as a Markdown table.

    .venv/bin/python -P bench/job.py                                   # the test model
    .venv/bin/python -P bench/job.py --model .gguf/SmolLM2-135M-Instruct-10L.Q4_1.gguf --no-gate
    .venv/bin/python -P bench/job.py --out bench/results/job-h100.md   # also write the table

A trimmed GGUF (bench/trim_gguf.py) keeps real statistics for its layers but its logits mean
nothing: validation still runs (and its numbers are reported), but `--no-gate` publishes the
bundle whatever they say. A path model is published as `bench/<file stem>` unless --publish-as.

Needs oscar_zoo importable with its server extras (`pip install --no-deps -e .` plus wheels
for fastapi, starlette, uvicorn, sqlalchemy, alembic, mako, pydantic, python-multipart, gguf
where the image lacks them). Nothing is fetched: the model is the GGUF, the data built in.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# The CLI through this interpreter (no console script needed, e.g. on the GPU machine).
CLI = [sys.executable, "-P", "-m", "oscar_zoo.zoo.cli.main"]
ROWS = (("loading", "load the model"), ("pass1", "pass 1 (query/key moments)"),
        ("pass2", "pass 2 (score-weighted V)"), ("fitting", "fit (eigh, Hadamard, bit-reversal)"),
        ("clip_search", "clip search (held-out windows)"), ("validating", "validation (INT2 kernels)"),
        ("publishing", "publish (upload, verify, record)"))


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m", help="catalog name, hub id or a .gguf/dir path")
    ap.add_argument("--publish-as", help="name to publish a path model under [bench/<stem>]")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--batch-size", type=int, help="windows per forward [automatic]")
    ap.add_argument("--clip-search", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--context-len", type=int, default=2048, help="validation context")
    ap.add_argument("--validation-windows", type=int, default=2)
    ap.add_argument("--no-gate", action="store_true",
                    help="publish even if validation fails (for trimmed models)")
    ap.add_argument("--out", type=Path, help="also write the table to this Markdown file")
    ap.add_argument("--timeout", type=float, default=3600)
    return ap.parse_args(argv)


def spec_of(args) -> dict:
    spec = {"model": args.model, "tokens": args.tokens, "seq_len": args.seq_len,
            "batch_size": args.batch_size, "clip_search": args.clip_search,
            "validation": {"context_len": args.context_len, "windows": args.validation_windows,
                           "require_pass": not args.no_gate}}
    path = Path(args.model).expanduser()
    if path.suffix == ".gguf" and not path.is_file():
        raise SystemExit(f"{path}: no such file (bench/trim_gguf.py makes trimmed GGUFs)")
    if path.suffix == ".gguf" or path.exists():
        spec["model"] = str(path.resolve())          # the worker's cwd may differ
        spec["publish_as"] = args.publish_as or f"bench/{path.stem.lower()}"
    elif args.publish_as:
        spec["publish_as"] = args.publish_as
    return spec


def start_server(work: Path) -> tuple[subprocess.Popen, str, dict]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "OSCAR_ZOO_DATA_DIR": str(work / "registry"),
           "OSCAR_ZOO_CACHE": str(work / "cache"), "OSCAR_ZOO_ENDPOINT": url,
           "OSCAR_ZOO_WORKERS": "1", "TOKENIZERS_PARALLELISM": "false"}
    for var in ("OSCAR_ZOO_DATABASE_URL", "OSCAR_ZOO_EXECUTOR", "OSCAR_ZOO_TOKEN"):
        env.pop(var, None)
    proc = subprocess.Popen([*CLI, "serve", "--port", str(port), "--log-level", "warning"],
                            env=env, start_new_session=True)
    import httpx

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit("the registry exited; see its log above")
        try:
            if httpx.get(f"{url}/v1/health", timeout=2).status_code == 200:
                return proc, url, env
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    raise SystemExit("the registry did not start")


def run(args) -> tuple[dict, dict, float]:
    from oscar_zoo.zoo.jobs_client import JobsClient

    work = Path(tempfile.mkdtemp(prefix="oscar-zoo-bench-job-"))
    proc, url, env = start_server(work)
    try:
        token = subprocess.run([*CLI, "tokens", "create", "--scope", "jobs:submit",
                                "--name", "bench"], env=env, check=True, text=True,
                               capture_output=True).stdout.strip()
        with JobsClient(url, token) as client:
            t0 = time.monotonic()
            job, _ = client.submit(spec_of(args))
            phase = None
            for state in client.events(job["id"]):
                if state["phase"] != phase:
                    phase = state["phase"]
                    print(f"[{time.monotonic() - t0:7.1f} s] {phase}", file=sys.stderr, flush=True)
                if time.monotonic() - t0 > args.timeout:
                    client.cancel(job["id"])
                    raise SystemExit(f"the job took over {args.timeout:.0f} s; cancelled")
            wall = time.monotonic() - t0
            job = client.get(job["id"])
            version = (client.registry.version(job["result"]["model"], job["result"]["version"])
                       if job.get("result") else {})
        return job, version, wall
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(work, ignore_errors=True)


def table(args, job: dict, version: dict, wall: float) -> str:
    t, p = job.get("timings") or {}, job.get("progress") or {}
    tokens = p.get("tokens_per_pass") or 0
    manifest = version.get("manifest") or {}
    cal, val = manifest.get("calibration") or {}, manifest.get("validation")
    lines = [f"# Calibration job end to end: {job['model']}", "",
             f"Date: {time.strftime('%Y-%m-%d')}. Command: `.venv/bin/python -P bench/job.py "
             f"{' '.join(sys.argv[1:])}`", "",
             f"Device: {cal.get('hardware') or platform.processor() or platform.machine()}; torch "
             f"{cal.get('torch_version')}, transformers {cal.get('transformers_version')}; executor "
             f"local (`oscar-zoo serve`, SQLite, one worker).",
             f"Job: {tokens:,} tokens per pass ({cal.get('prompts')} x {cal.get('seq_len')}), clip "
             f"search {'on' if args.clip_search else 'off'}, validation {args.validation_windows} "
             f"windows at context {args.context_len} (gate {'off' if args.no_gate else 'on'}). "
             f"Status: **{job['status']}**, attempts {job['attempts']}"
             + (f", version {version.get('version')} ({version.get('status')})" if version else "")
             + (f". Error: {job['error']}" if job.get("error") else "."), "",
             "| phase | seconds | tokens/s |", "|---|---:|---:|"]
    for key, name in ROWS:
        if not t.get(key):          # not run (clip search off, no pass 2 for vtv, ...)
            continue
        rate = f"{tokens / t[key]:,.0f}" if key in ("pass1", "pass2") and t[key] else "-"
        lines.append(f"| {name} | {t[key]:.2f} | {rate} |")
    calib = sum(t.get(k, 0.0) for k in ("pass1", "pass2", "fitting"))
    if calib:
        lines.append(f"| calibration = pass 1 + pass 2 + fit | {calib:.2f} | {tokens / calib:,.0f} |")
    lines.append(f"| job total (worker) | {t.get('total', 0):.2f} | - |")
    lines.append(f"| submit -> succeeded (client wall) | {wall:.2f} | - |")
    lines += ["", "Pass 1 includes the first forward's one-time costs (allocator, kernels' first "
              f"launch). Load average at the end: {', '.join(f'{x:.1f}' for x in os.getloadavg())} "
              f"on {os.cpu_count()} CPUs."]
    if val:
        by = {v["name"]: v for v in val["variants"]}
        lines += ["", f"Validation ({val['eval_tokens']:,} tokens of {val['dataset']}): "
                  f"{'passed' if val['passed'] else 'FAILED'}; extra loss (nats/token): "
                  + ", ".join(f"{n} {by[n]['delta_nll']:+.4f}" for n in ("bundle", "oscar-shipped", "hadamard", "naive") if n in by)
                  + (" (trimmed model: logits are not meaningful)" if args.no_gate else "")]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse(argv)
    job, version, wall = run(args)
    out = table(args, job, version, wall)
    print(out)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(out)
    print(json.dumps({"status": job["status"], "timings": job.get("timings")}), file=sys.stderr)
    return 0 if job["status"] == "succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())
