"""Web UI page render time with 100 models and 1,000 versions in the database (target < 200 ms
server time per page).

    .venv/bin/python -P bench/ui.py [--backend sqlite|postgresql|both] [--requests 30]
                                    [--bulk-models 10000] [--out bench/results/ui.md]

Seeds a fresh registry: the 10 catalog models plus 90 uploaded ones, 10 versions each (the
catalog's GLM-4.7 and Qwen3.5 versions alternate per-layer and per-KV-head rotations), every
version with a validation report and per-(layer, head) clips; 200 job rows. Serves it on
loopback (uvicorn, as `oscar-zoo serve`) and requests each page: once cold (templates compile,
blobs are verified on first read), then --requests times. Reports the server time each page
puts in its Server-Timing header (handler + queries + tensor reads + charts + template), the
client's wall time, and the page's size.

--bulk-models N adds N more models written straight into the database (3 versions each, no
files: their own pages are not timed; tests/api/ui/seeding.py add_bulk_models), so that the
home page's orders are timed at a scale where an order worked out outside the database shows.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from datetime import date
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the seeding helpers live with the tests

MODELS, VERSIONS_PER_MODEL, JOBS = 100, 10, 200


def seed(server, root: Path) -> None:
    from oscar_zoo.registry_db.models import Job
    from oscar_zoo.zoo.bundle import Bundle, write
    from oscar_zoo.zoo.catalog import CATALOG

    from tests.api.ui.seeding import searched_clips, validation
    from tests.utils.bundles import make_manifest, make_tensors

    plan = [(e.name, None) for e in CATALOG]
    plan += [("smollm2-135m", f"bench-{i:03d}") for i in range(MODELS - len(plan))]
    tensors: dict = {}
    for n, (geometry_of, name) in enumerate(plan):
        for i in range(VERSIONS_PER_MODEL):
            per_head = geometry_of in ("glm-4.7-fp8", "qwen3.5-4b") and i % 2 == 1
            key = (geometry_of, per_head)
            if key not in tensors:  # random QR is slow; versions of one shape share tensors
                tensors[key] = make_tensors(make_manifest(geometry_of, per_head), 0)
            k, v = tensors[key]
            m = make_manifest(geometry_of, per_head, seed=n * 100 + i)
            if name:
                m = m.model_copy(update={"model": m.model.model_copy(update={
                    "name": name, "hub_id": f"bench-org/{name}", "architecture": f"BenchArch{n % 7}"})})
            layers = len(m.geometry.to_geometry().layers())
            m = m.model_copy(update={"validation": validation(layers, i, passed=i % 3 != 0),
                                     "clip": searched_clips(k, v, i)})
            write(Bundle(m, k, v), root / f"{n}-{i}")
            server.publish_dir(root / f"{n}-{i}")
    with server.registry.db.write() as session:
        for j in range(JOBS):
            model = plan[j % len(plan)][1] or plan[j % len(plan)][0]
            session.add(Job(spec={"model": model}, model=model,
                            status=("queued", "running", "succeeded", "failed")[j % 4],
                            phase="pass1", progress={"phase": "pass1", "done": j % 30, "total": 30}))


def pages(server) -> list[tuple[str, str]]:
    from oscar_zoo.registry_db import jobs

    with server.registry.db.read() as session:
        job = jobs.list_jobs(session, limit=1).items[0].id
    return [
        ("home (first 50 models by name)", "/"),
        ("home, search `bench-0*`", "/?q=bench-0*"),
        ("home, validated only", "/?validated=true"),
        # the other orders are worked out in the database too, one query a page: near the above
        ("home, by extra loss", "/?sort=loss"),
        ("home, newest published first", "/?sort=-published"),
        ("home, most versions first", "/?sort=-versions"),
        ("home, by name descending", "/?sort=-name"),
        ("home, validated only, by extra loss", "/?validated=true&sort=loss"),
        ("home, by extra loss, 2nd page", next_page(server, "/?sort=loss")),
        ("model, 10 versions", "/models/bench-042"),
        ("model, 10 versions by extra loss", "/models/bench-042?sort=loss"),
        ("model glm-4.7-fp8", "/models/glm-4.7-fp8"),
        ("version bench (30 layers, 3 KV heads)", "/models/bench-042/versions/7"),
        ("version glm-4.7-fp8 per layer (92 layers)", "/models/glm-4.7-fp8/versions/9"),
        ("version glm-4.7-fp8 per KV head (92 x 8)", "/models/glm-4.7-fp8/versions/10"),
        ("version qwen3.5-4b per KV head (hybrid)", "/models/qwen3.5-4b/versions/10"),
        ("jobs list (200 jobs)", "/jobs"),
        ("job detail", f"/jobs/{job}"),
    ]


def next_page(server, path: str) -> str:
    """The page a list's "More models" link leads to (its cursor is made by the first page)."""
    import html
    import re

    with server.client() as http:
        first = http.get(path).text
    return "/" + html.unescape(re.search(r'<a href="(\?[^"]+)" rel="next">', first).group(1))


def measure(http, path: str, n: int) -> dict:
    def once() -> tuple[float, float, int]:
        t = time.perf_counter()
        r = http.get(path)
        wall = (time.perf_counter() - t) * 1000
        assert r.status_code == 200, (path, r.status_code, r.text[:300])
        return float(r.headers["server-timing"].split("dur=")[1]), wall, len(r.content)

    cold = once()[0]
    runs = [once() for _ in range(n)]
    server_ms = sorted(r[0] for r in runs)
    return {"cold": cold, "median": statistics.median(server_ms),
            "p95": server_ms[min(len(server_ms) - 1, int(0.95 * len(server_ms)))],
            "max": server_ms[-1], "wall": statistics.median(r[1] for r in runs),
            "kb": runs[0][2] / 1000}


def run(backend: str, n: int, bulk: int = 0) -> list[str]:
    from tests.utils.databases import fresh_database
    from tests.utils.registry_server import run_registry

    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        url = stack.enter_context(fresh_database(backend, tmp))
        server = stack.enter_context(run_registry(url, tmp / "data"))
        t = time.perf_counter()
        seed(server, tmp / "bundles")
        if bulk:
            from tests.api.ui.seeding import add_bulk_models

            add_bulk_models(server.registry.db, bulk)
            if backend == "postgresql":
                # as autovacuum would have by the time anyone pages: without it the planner
                # takes the tables for the near-empty ones they were before the bulk insert
                with server.registry.db.engine.begin() as conn:
                    conn.exec_driver_sql("analyze")
        print(f"{backend}: seeded in {time.perf_counter() - t:.0f} s", file=sys.stderr)
        rows = []
        with server.client() as http:
            for label, path in pages(server):
                m = measure(http, path, n)
                rows.append(f"| {backend} | {label} | {m['median']:.1f} | {m['p95']:.1f} | "
                            f"{m['max']:.1f} | {m['cold']:.1f} | {m['wall']:.1f} | {m['kb']:.0f} |")
                print(rows[-1], file=sys.stderr)
        return rows


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                if line.startswith("model name")), platform.processor())
    load = os.getloadavg()[0]
    return (f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, "
            f"load average {load:.1f} at the start (a shared machine)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=("sqlite", "postgresql", "both"), default="both")
    ap.add_argument("--requests", type=int, default=30)
    ap.add_argument("--bulk-models", type=int, default=0, metavar="N",
                    help="N more models written straight into the database (see above)")
    ap.add_argument("--out", type=Path, help="also write the table (markdown) here")
    args = ap.parse_args(argv)
    where = machine()
    header = ["| backend | page | median ms | p95 ms | max ms | cold ms | client wall ms (median) | KB |",
              "|---|---|---|---|---|---|---|---|"]
    rows = []
    for backend in (("sqlite", "postgresql") if args.backend == "both" else (args.backend,)):
        rows += run(backend, args.requests, args.bulk_models)
    table = "\n".join(header + rows)
    print(table)
    if args.out:
        args.out.write_text(
            f"# Web UI render time\n\n{date.today().isoformat()}, {where}.\n\n"
            f"Command: `.venv/bin/python -P bench/ui.py --backend {args.backend} --requests "
            f"{args.requests}" + (f" --bulk-models {args.bulk_models}" if args.bulk_models else "")
            + f"`\n\n{MODELS} models, {MODELS * VERSIONS_PER_MODEL} versions, {JOBS} jobs"
            + (f", and {args.bulk_models} bulk models (3 versions each, no files)" if args.bulk_models else "")
            + ". "
            "Server time is the page's `Server-Timing` (route handler: queries, tensor reads, "
            "charts, template); target < 200 ms. Cold is the first request after start "
            "(template compile, first blob verification).\n\n" + table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
