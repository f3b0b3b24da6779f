"""How fast is the client? `oscar-zoo --help`, warm and cold pulls, beside `hf download`.

    .venv/bin/python bench/pull.py [--runs 5] [--out bench/results/pull.md]

Everything is local and real: the registry (uvicorn on loopback, SQLite) serves a GLM-4.7-FP8
size bundle (92 layers x 2 sides, 128x128 float32: 12 MB); the loopback hub emulator
(tests/hub_emulator) serves the same bundle files and the RotationZoo .pt pair; `hf download`
(huggingface_hub's CLI, xet off as in our tests) fetches the same files from the same emulator.
Every measurement is the wall time of a fresh process, as a user sees it (median of --runs).
Targets (the pull issue): --help and a warm pull under 0.3 s; a cold pull of a GLM-4.7 size
bundle from a local registry under 1 s.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
BIN = Path(sys.executable).parent
ZOO = [str(BIN / "oscar-zoo")]
HF = [str(BIN / "hf")]
GLM = "GLM-4.7-FP8/seq10000_prompt43_group128"
MIRROR = "oscar-zoo/bench-mirror"


def timed(cmd: list[str], env: dict, runs: int, fresh: dict[str, Path] | None = None) -> list[tuple[float, float]]:
    """(wall s, CPU s of the child) of `cmd` in a new process, per run; `fresh` dirs are
    emptied before each run. CPU time (user + system) shows the client's own cost when a busy
    machine stretches the wall time."""
    import resource

    times = []
    for _ in range(runs):
        for d in (fresh or {}).values():
            shutil.rmtree(d, ignore_errors=True)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        times.append((wall, cpu))
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr.decode()[-3000:]}")
    return times


def oscar_pt(objective: str, seed: int) -> bytes:
    """A RotationZoo-style format 1 file (92 layers, d=128), written without torch."""
    import numpy as np

    from oscar_zoo.zoo.interop.pt_writer import dumps

    rng = np.random.default_rng(seed)
    q, r = np.linalg.qr(rng.standard_normal((92, 128, 128)))
    q = (q * np.sign(np.diagonal(r, axis1=-2, axis2=-1))[..., None, :]).astype(np.float32)
    layers = {i: {"layer_id": i, "rotation": q[i],
                  "eigenvalues": np.sort(rng.gamma(2.0, size=128)).astype(np.float32)}
              for i in range(92)}
    return dumps({"format_version": 1, "objective": objective, "source_grouping": "layer",
                  "layers": layers}, objective)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out", type=Path, help="also write the table (markdown) here")
    args = ap.parse_args()
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        os.environ.setdefault(var, "1")

    from tests.hub_emulator import HubEmulator
    from tests.utils.bundles import make_bundle
    from tests.utils.databases import fresh_database
    from tests.utils.registry_server import run_registry

    work = Path(tempfile.mkdtemp(prefix="oscar-zoo-bench-"))
    bundle = make_bundle(work / "bundle", model="glm-4.7-fp8")
    zoo = {f"{GLM}/k_rotation_qqt_r_h_pbr.pt": oscar_pt("qqt_r_h_pbr", 1),
           f"{GLM}/v_rotation_sst_r_h_pbr.pt": oscar_pt("sst_r_h_pbr", 2)}
    bundle_files = {f"{GLM}/{p.name}": p.read_bytes() for p in sorted(bundle.path.iterdir())}
    rows = []
    with HubEmulator() as hub, fresh_database("sqlite", work) as url, \
            run_registry(url, work / "registry") as server:
        server.publish_dir(bundle.path)
        hub.seed("hf", "Zhongzhu/OSCAR-RotationZoo", zoo)
        hub.seed("hf", MIRROR, bundle_files)
        base = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HUB_DISABLE_XET": "1",
                "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_UPDATE_CHECK": "1",
                "HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_TOKEN": "hf_bench",
                "MODELSCOPE_ENDPOINT": hub.url, "MODELSCOPE_DOWNLOAD_INTRA_CLOUD": "false",
                "OSCAR_ZOO_CONFIG_DIR": str(work / "config")}
        size = sum(len(b) for b in bundle_files.values())
        pt_size = sum(len(b) for b in zoo.values())

        def zoo_env(source: str, cache: Path) -> dict:
            env = {**base, "OSCAR_ZOO_CACHE": str(cache), "OSCAR_ZOO_SOURCES": source}
            if source == "registry":
                env["OSCAR_ZOO_ENDPOINT"] = server.url
            return env

        def hf_env(home: Path) -> dict:
            return {**base, "HF_HOME": str(home)}

        runs = args.runs
        rows.append(("`oscar-zoo --help`", "-", timed(ZOO + ["--help"], base, runs), 0.3))
        rows.append(("`hf --help`", "-", timed(HF + ["--help"], base, runs), None))
        # registry: cold (fresh cache each run) and warm, the bundle itself and SGLang files
        for fmt in ("safetensors", "sglang"):
            cache = work / f"cache-reg-{fmt}"
            cmd = ZOO + ["pull", "glm-4.7-fp8", "--format", fmt, "-q"]
            rows.append((f"cold `oscar-zoo pull glm-4.7-fp8 --format {fmt}` (registry)",
                         f"{size / 1e6:.1f} MB", timed(cmd, zoo_env("registry", cache), runs,
                                                       {"c": cache}), 1.0))
            timed(cmd, zoo_env("registry", cache), 1)
            rows.append((f"warm `oscar-zoo pull glm-4.7-fp8 --format {fmt}` (registry)", "0",
                         timed(cmd, zoo_env("registry", cache), runs), 0.3))
        home = work / "hf-home-bundle"
        cmd = HF + ["download", MIRROR, "--include", f"{GLM}/*", "--local-dir", str(work / "hf-bundle")]
        rows.append(("cold `hf download` of the same bundle files (emulator)", f"{size / 1e6:.1f} MB",
                     timed(cmd, hf_env(home), runs, {"h": home, "d": work / "hf-bundle"}), None))
        cmd = HF + ["download", MIRROR, "--include", f"{GLM}/*"]
        timed(cmd, hf_env(home), 1)
        rows.append(("warm `hf download` of the same bundle files (emulator)", "0",
                     timed(cmd, hf_env(home), runs), None))
        # the public RotationZoo layout: .pt pair -> converted bundle -> SGLang files
        cache = work / "cache-hf"
        cmd = ZOO + ["pull", "glm-4.7-fp8", "-q"]
        rows.append(("cold `oscar-zoo pull glm-4.7-fp8` (HF RotationZoo .pt, converted)",
                     f"{pt_size / 1e6:.1f} MB", timed(cmd, zoo_env("hf", cache), runs, {"c": cache}), None))
        timed(cmd, zoo_env("hf", cache), 1)
        rows.append(("warm `oscar-zoo pull glm-4.7-fp8` (HF RotationZoo)", "0",
                     timed(cmd, zoo_env("hf", cache), runs), 0.3))
        home = work / "hf-home-zoo"
        cmd = HF + ["download", "Zhongzhu/OSCAR-RotationZoo", "--include", f"{GLM}/*"]
        rows.append(("cold `hf download` of the same .pt pair (emulator)", f"{pt_size / 1e6:.1f} MB",
                     timed(cmd, hf_env(home), runs, {"h": home}), None))
        timed(cmd, hf_env(home), 1)
        rows.append(("warm `hf download` of the same .pt pair (emulator)", "0",
                     timed(cmd, hf_env(home), runs), None))
    shutil.rmtree(work, ignore_errors=True)
    table = render(rows, runs)
    print(table)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(table)


def render(rows, runs: int) -> str:
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0, 0, 0)
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() \
        else platform.processor()
    head = [
        "# oscar-zoo pull: client speed",
        "",
        f"- date: {time.strftime('%Y-%m-%d')}",
        f"- machine: {cpu}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}; load average at the end {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}",
        f"- command: `.venv/bin/python bench/pull.py --runs {runs} --out bench/results/pull.md`",
        "- each row runs a new process: its wall time (median and min of the runs) and its CPU "
        "time (user + system, median), which stays close to the client's own cost when other "
        "work on the machine stretches the wall time; servers on 127.0.0.1: the registry "
        "(uvicorn + SQLite, in the bench process) and the hub emulator (tests/hub_emulator, "
        "HF_HUB_DISABLE_XET=1)",
        "",
        "| what | downloaded | wall median s | wall min s | CPU median s | target s (wall) | |",
        "|---|---|---|---|---|---|---|",
    ]
    for what, size, times, target in rows:
        walls, cpus = [w for w, _ in times], [c for _, c in times]
        med, low = statistics.median(walls), min(walls)
        verdict = "" if target is None else ("ok" if med < target else "MISSED")
        head.append(f"| {what} | {size} | {med:.3f} | {low:.3f} | {statistics.median(cpus):.3f} | "
                    f"{target or '-'} | {verdict} |")
    return "\n".join(head) + "\n"


if __name__ == "__main__":
    main()
