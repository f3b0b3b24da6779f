"""Registry API load benchmark: metadata endpoints at 64 concurrent clients (SQLite and
PostgreSQL), and download throughput of a bundle file beside nginx serving the same file.

    .venv/bin/python bench/api.py [--seconds 4] [--concurrency 64] [--backends sqlite,postgresql]

The registry runs as `oscar-zoo serve` in its own process (one uvicorn worker), the load comes
from an async httpx client pool in this process, nginx (Debian package, installed with apt-get
if missing) is started on loopback with a throw-away config. Everything stays on 127.0.0.1 and
stops by itself. Prints Markdown tables (bench/results/api.md keeps a run).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # for tests.utils.bundles (no transformers here: kernels/ is harmless)

from tests.utils.bundles import make_bundle  # noqa: E402

POSTGRES_URL = os.environ.get("OSCAR_ZOO_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
ENDPOINTS = [
    ("list models", "/v1/models?limit=50"),
    ("search (glob, published)", "/v1/models?q=smol*&published=true"),
    ("model detail (hub id)", "/v1/models/HuggingFaceTB/SmolLM2-135M-Instruct"),
    ("version detail (alias)", "/v1/models/smollm2-135m/versions/latest"),
    ("versions list", "/v1/models/smollm2-135m/versions"),
    ("one layer+head (JSON)", "/v1/models/smollm2-135m/versions/latest/layers/7?side=k&head=1"),
    ("HEAD bundle.json", "HEAD /v1/models/smollm2-135m/versions/1/files/bundle.json"),
]


def run(coro):
    """uvloop when installed (uvicorn[standard] brings it): the client costs less CPU."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) of a process and its direct children, from /proc.

    Under a shared, loaded machine wall-clock rates swing; CPU per request does not.
    """
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(entry.name) == pid or int(fields[1]) == pid:  # fields[1]: ppid
            total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return total


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=2)
            return
        except httpx.TransportError:
            time.sleep(0.05)
    raise RuntimeError(f"{url} did not come up")


# --- the registry under test -----------------------------------------------------------------

def database_url(backend: str, work: Path) -> tuple[str, str | None]:
    if backend == "sqlite":
        return f"sqlite:///{work}/registry.sqlite", None
    import psycopg

    schema = f"oz_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(f'create schema "{schema}"')
    return f"{POSTGRES_URL}?options=-csearch_path%3D{schema}", schema


def drop_schema(schema: str | None) -> None:
    if schema:
        import psycopg

        with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
            conn.execute(f'drop schema if exists "{schema}" cascade')


def seed(url: str, data: Path, bundles: list[Path]) -> None:
    from oscar_zoo.registry_db.registry import open_registry

    registry = open_registry(url, data)
    for b in bundles:
        registry.publish(b, created_by="bench")
    registry.close()


def start_registry(url: str, data: Path, port: int) -> subprocess.Popen:
    env = {**os.environ, "OSCAR_ZOO_DATABASE_URL": url, "OSCAR_ZOO_DATA_DIR": str(data)}
    proc = subprocess.Popen([sys.executable, "-m", "oscar_zoo.zoo.cli.main", "serve", "--port",
                             str(port), "--no-workers", "--log-level", "warning"], env=env)
    wait_http(f"http://127.0.0.1:{port}/v1/health")
    return proc


# --- nginx beside it -------------------------------------------------------------------------

def nginx_binary() -> str:
    found = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if found:
        return found
    print("nginx not found: installing the Debian package (apt-get install -y nginx)", file=sys.stderr)
    subprocess.run(["apt-get", "update", "-qq"], check=True)
    subprocess.run(["apt-get", "install", "-y", "-qq", "nginx"], check=True,
                   env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    return shutil.which("nginx") or "/usr/sbin/nginx"


def start_nginx(root: Path, port: int, work: Path) -> subprocess.Popen:
    prefix = work / "nginx"
    (prefix / "logs").mkdir(parents=True, exist_ok=True)
    user = "user root;" if os.geteuid() == 0 else ""  # temp dirs are 0700: workers must read them
    conf = prefix / "nginx.conf"
    conf.write_text(f"""{user}
worker_processes 1;
daemon off;
pid {prefix}/nginx.pid;
error_log {prefix}/logs/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    sendfile on;
    tcp_nopush on;
    client_body_temp_path {prefix}/body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    server {{
        listen 127.0.0.1:{port};
        root {root};
        location / {{ }}
    }}
}}
""")
    proc = subprocess.Popen([nginx_binary(), "-c", str(conf), "-p", str(prefix)])
    wait_http(f"http://127.0.0.1:{port}/")
    return proc


# --- load ------------------------------------------------------------------------------------

async def hammer(base: str, path: str, seconds: float, concurrency: int, pid: int) -> dict:
    method, _, path = path.rpartition(" ")
    method = method or "GET"
    latencies: list[float] = []
    errors = 0
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=60) as client:
        await client.request(method, path)  # warm: first verification, caches
        deadline = time.perf_counter() + seconds

        async def worker():
            nonlocal errors
            while time.perf_counter() < deadline:
                t0 = time.perf_counter()
                r = await client.request(method, path)
                latencies.append(time.perf_counter() - t0)
                errors += r.status_code >= 400

        cpu0, t0 = cpu_seconds(pid), time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall, cpu = time.perf_counter() - t0, cpu_seconds(pid) - cpu0
    latencies.sort()
    return {"n": len(latencies), "rps": len(latencies) / wall, "errors": errors,
            "cpu_ms": 1000 * cpu / max(len(latencies), 1),
            "p50": 1000 * latencies[len(latencies) // 2],
            "p99": 1000 * latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]}


async def download(url: str, pid: int, streams: int, rounds: int) -> tuple[float, float]:
    """Aggregate MB/s of `streams` clients each fetching `url` `rounds` times, and the server's
    CPU milliseconds per MB sent."""
    total = 0

    async def one(client):
        nonlocal total
        for _ in range(rounds):
            async with client.stream("GET", url) as r:
                r.raise_for_status()
                async for chunk in r.aiter_raw(1 << 20):
                    total += len(chunk)

    async with httpx.AsyncClient(timeout=120) as client:
        await one_shot(client, url)
        cpu0, t0 = cpu_seconds(pid), time.perf_counter()
        await asyncio.gather(*(one(client) for _ in range(streams)))
        wall, cpu = time.perf_counter() - t0, cpu_seconds(pid) - cpu0
    return total / wall / 1e6, 1000 * cpu / (total / 1e6)


async def one_shot(client, url):
    async with client.stream("GET", url) as r:
        async for _ in r.aiter_raw(1 << 20):
            pass


# --- main ------------------------------------------------------------------------------------

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=4.0, help="per endpoint and backend")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--backends", default="sqlite,postgresql")
    ap.add_argument("--download-model", default="glm-4.7-fp8",
                    help="catalog model whose per-head bundle file is downloaded")
    ap.add_argument("--streams", default="1,4", help="concurrent downloads to measure")
    ap.add_argument("--rounds", type=int, default=3, help="downloads per stream")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="oscar-zoo-bench-"))
    procs: list[subprocess.Popen] = []
    try:
        print(f"making bundles in {work} ...", file=sys.stderr)
        bundles = [make_bundle(work / f"smol-{i}", seed=i, per_head=bool(i % 2)).path for i in range(5)]
        big = make_bundle(work / "big", model=args.download_model, per_head=True).path
        static = work / "static"  # what nginx serves: the same bytes the registry serves
        static.mkdir()
        for name in ("bundle.json", "rotations.safetensors"):
            shutil.copy(big / name, static / name)
        nginx_port = free_port()
        nginx_proc = start_nginx(static, nginx_port, work)
        procs.append(nginx_proc)
        nginx = f"http://127.0.0.1:{nginx_port}"
        print("nginx: static bundle.json ...", file=sys.stderr)
        meta_rows = [("nginx", "static bundle.json (harness ceiling)",
                      run(hammer(nginx, "/bundle.json", args.seconds, args.concurrency,
                                nginx_proc.pid)))]
        dl_rows = []
        for backend in args.backends.split(","):
            url, schema = database_url(backend, work)
            data = work / f"data-{backend}"
            try:
                seed(url, data, bundles + ([big] if backend == "sqlite" else []))
                port = free_port()
                proc = start_registry(url, data, port)
                procs.append(proc)
                base = f"http://127.0.0.1:{port}"
                for label, path in ENDPOINTS:
                    print(f"{backend}: {label} ...", file=sys.stderr)
                    res = run(hammer(base, path, args.seconds, args.concurrency, proc.pid))
                    meta_rows.append((backend, label, res))
                if backend == "sqlite":
                    ours = f"{base}/v1/models/{args.download_model}/versions/1/files/rotations.safetensors"
                    dl_rows = measure_downloads((ours, proc.pid),
                                                (f"{nginx}/rotations.safetensors", nginx_proc.pid),
                                                static / "rotations.safetensors", args)
                proc.terminate()
                proc.wait(10)
            finally:
                drop_schema(schema)
        print_report(meta_rows, dl_rows, args)
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                p.wait(10)
        shutil.rmtree(work, ignore_errors=True)


def measure_downloads(ours: tuple[str, int], theirs: tuple[str, int], file: Path, args) -> list:
    rows = []
    for streams in (int(s) for s in args.streams.split(",")):
        print(f"download x{streams} ...", file=sys.stderr)
        a = run(download(*ours, streams, args.rounds))
        b = run(download(*theirs, streams, args.rounds))
        rows.append((streams, file.stat().st_size, a, b))
    return rows


def print_report(meta_rows, dl_rows, args) -> None:
    print(f"### Metadata endpoints, {args.concurrency} concurrent clients, "
          f"{args.seconds:g} s each\n")
    print("| backend | endpoint | requests | req/s | p50 ms | p99 ms | server CPU ms/req | errors |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for backend, label, r in meta_rows:
        print(f"| {backend} | {label} | {r['n']} | {r['rps']:.0f} | {r['p50']:.1f} | "
              f"{r['p99']:.1f} | {r['cpu_ms']:.2f} | {r['errors']} |")
    if dl_rows:
        print(f"\n### Download of rotations.safetensors ({args.download_model}, per KV head), "
              f"{args.rounds} downloads per stream\n")
        print("| streams | file MB | oscar-zoo MB/s | nginx MB/s | oscar-zoo / nginx | "
              "server CPU ms/MB: oscar-zoo | nginx |")
        print("|---:|---:|---:|---:|---:|---:|---:|")
        for streams, size, (ours, our_cpu), (theirs, their_cpu) in dl_rows:
            print(f"| {streams} | {size / 1e6:.1f} | {ours:.0f} | {theirs:.0f} | "
                  f"{ours / theirs:.2f} | {our_cpu:.2f} | {their_cpu:.2f} |")
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"\nmachine: {platform.machine()}, {os.cpu_count()} CPUs, Python "
          f"{platform.python_version()}, {platform.platform()}; load average at the end "
          f"{load} (other processes share these cores)")


if __name__ == "__main__":
    main()
