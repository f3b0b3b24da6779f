"""Fixtures for the client tests: a socket guard, the loopback hub emulator, RotationZoo files.

- `no_network` (autouse): any connection or DNS lookup that is not loopback fails the test,
  even when a library swallows the error (hubs.md 3.4: telemetry, region probes, peer sites).
- `hub`: the session's HubEmulator, emptied, with the env the real clients need
  (HF_ENDPOINT, MODELSCOPE_ENDPOINT, tokens) set for this test only.
- `zoo_files`: a RotationZoo-layout file set written by torch.save: GLM-4.7-FP8 (92 layers,
  d=128, format 1) and Qwen3-30B-A3B per KV head (format 2); `seed_zoo(hub)` commits it.
"""

from __future__ import annotations

import contextlib

import io
import ipaddress
import os
import socket

# Small matrices everywhere here: one BLAS thread (see zoo/cli/client_cmds.py _small_blas).
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from tests.hub_emulator import HubEmulator, point_hf_client_at  # noqa: E402

# modelscope-hub reads these at import: its own retries (up to ~7 s per failing listing, which
# is right for users) would dominate the error-path tests. Our retries are tested with ours.
os.environ.setdefault("MODELSCOPE_REPO_TREE_PAGE_MAX_ATTEMPTS", "1")
os.environ.setdefault("MODELSCOPE_API_MAX_RETRIES", "1")
os.environ.setdefault("MODELSCOPE_DOWNLOAD_MAX_RETRIES", "1")

LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1", "ip6-localhost"}
HF_ZOO = "Zhongzhu/OSCAR-RotationZoo"
MS_ZOO = "togethercomputer/OSCAR-RotationZoo"
GLM_FOLDER = "GLM-4.7-FP8/seq10000_prompt43_group128"
GLM_FILES = ("k_rotation_qqt_r_h_pbr.pt", "v_rotation_sst_r_h_pbr.pt")
QWEN30_FILES = ("k_rotation_perhead.pt", "v_rotation_perhead.pt")


# --- socket guard ------------------------------------------------------------------------------

class NonLoopbackConnection(ConnectionRefusedError):
    pass


def _is_loopback(host) -> bool:
    if host is None:
        return True
    host = host.decode() if isinstance(host, bytes) else str(host)
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    attempts: list[str] = []
    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex
    real_getaddrinfo = socket.getaddrinfo

    def check(sock, address):
        if sock.family in (socket.AF_INET, socket.AF_INET6) and not _is_loopback(address[0]):
            attempts.append(f"connect {address}")
            raise NonLoopbackConnection(f"test socket guard: connection to {address} refused")

    def connect(sock, address):
        check(sock, address)
        return real_connect(sock, address)

    def connect_ex(sock, address):
        check(sock, address)
        return real_connect_ex(sock, address)

    def getaddrinfo(host, *args, **kwargs):
        if not _is_loopback(host):
            attempts.append(f"resolve {host}")
            raise socket.gaierror(socket.EAI_NONAME, f"test socket guard: lookup of {host} refused")
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    yield attempts
    if attempts:
        pytest.fail(f"non-loopback network access attempted: {attempts}")


# --- the hub emulator --------------------------------------------------------------------------

@pytest.fixture(scope="session")
def hub_server():
    with HubEmulator() as emulator:
        yield emulator


@pytest.fixture
def hub(hub_server, monkeypatch):
    hub_server.reset()
    env = {"HF_ENDPOINT": hub_server.url, "MODELSCOPE_ENDPOINT": hub_server.url,
           "HF_TOKEN": "hf_test", "MODELSCOPE_API_TOKEN": "ms_test",
           "OSCAR_ZOO_SOURCES": "hf,modelscope", "OSCAR_ZOO_HTTP_RETRIES": "2",
           "OSCAR_ZOO_HTTP_TIMEOUT": "5"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    point_hf_client_at(hub_server.url, monkeypatch)
    yield hub_server
    hub_server.reset()


# --- RotationZoo files -------------------------------------------------------------------------

def random_orthogonal(rng: np.random.Generator, *shape: int) -> np.ndarray:
    q, r = np.linalg.qr(rng.standard_normal(shape))
    return (q * np.sign(np.diagonal(r, axis1=-2, axis2=-1))[..., None, :]).astype(np.float32)


def oscar_pt(objective: str, grouping: str, fv: int, layers: int, d: int, heads: int | None,
             seed: int) -> bytes:
    """An OSCAR rotation checkpoint, written by torch.save exactly as OSCAR's scripts do."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(seed)
    out = {}
    for i in range(layers):
        shape = (heads, d, d) if heads else (d, d)
        entry = {"layer_id": i, "rotation": torch.from_numpy(random_orthogonal(rng, *shape))}
        if heads is None:  # format 2 files carry no eigenvalues (oscar-spec 1.3)
            entry["eigenvalues"] = torch.from_numpy(np.sort(rng.gamma(2.0, size=d)).astype(np.float32))
        out[i] = entry
    buf = io.BytesIO()
    torch.save({"format_version": fv, "objective": objective, "source_grouping": grouping,
                "layers": out}, buf)
    return buf.getvalue()


@pytest.fixture(scope="session")
def zoo_files() -> dict[str, bytes]:
    return {
        f"{GLM_FOLDER}/{GLM_FILES[0]}": oscar_pt("qqt_r_h_pbr", "layer", 1, 92, 128, None, 1),
        f"{GLM_FOLDER}/{GLM_FILES[1]}": oscar_pt("sst_r_h_pbr", "layer", 1, 92, 128, None, 2),
        f"Qwen3-30B-A3B/{QWEN30_FILES[0]}": oscar_pt("cov_eig_hadamard_perhead", "per_kv_head", 2,
                                                     48, 128, 4, 3),
        f"Qwen3-30B-A3B/{QWEN30_FILES[1]}": oscar_pt("cov_eig_hadamard_perhead", "per_kv_head", 2,
                                                     48, 128, 4, 4),
        "README.md": b"# OSCAR RotationZoo (test copy)\n",
    }


@pytest.fixture
def seed_zoo(hub, zoo_files):
    """Call to commit the zoo to the HF repo and the ModelScope mirror (or one of them)."""
    def seed(hubs=("hf", "ms")) -> None:
        if "hf" in hubs:
            hub.seed("hf", HF_ZOO, zoo_files)
        if "ms" in hubs:
            hub.seed("ms", MS_ZOO, zoo_files)
    return seed


@pytest.fixture
def hf_only(seed_zoo, monkeypatch):
    """The zoo on the HF emulator, and pulls asking only there."""
    seed_zoo(("hf",))
    monkeypatch.setenv("OSCAR_ZOO_SOURCES", "hf")


def flip_a_byte(path) -> None:
    """Corrupt a cached (read-only) file in place, as bit rot would."""
    os.chmod(path, 0o644)
    with open(path, "r+b") as f:
        f.seek(1000)
        byte = f.read(1)
        f.seek(1000)
        f.write(bytes([byte[0] ^ 1]))


@pytest.fixture
def registry(tmp_path, monkeypatch, hub):
    """A real registry server (SQLite) on loopback, the client pointed at it first."""
    from tests.utils.databases import fresh_database
    from tests.utils.registry_server import run_registry

    with fresh_database("sqlite", tmp_path) as url, run_registry(url, tmp_path / "reg") as server:
        monkeypatch.setenv("OSCAR_ZOO_ENDPOINT", server.url)
        monkeypatch.setenv("OSCAR_ZOO_SOURCES", "registry,hf,modelscope")
        yield server


@pytest.fixture(scope="module")
def glm_bundles(tmp_path_factory):
    """Two random GLM-4.7-FP8 bundles (seeds 0 and 1), made once per test module."""
    from tests.utils.bundles import make_bundle

    root = tmp_path_factory.mktemp("bundles")
    return [make_bundle(root / f"glm{i}", model="glm-4.7-fp8", seed=i) for i in (0, 1)]


@pytest.fixture
def cache_root(sandbox):
    return sandbox / "cache"


def env_for_subprocess(extra: dict | None = None) -> dict:
    """The current env (sandbox and hub settings included) for a child `oscar-zoo` process."""
    env = dict(os.environ)
    env.update(extra or {})
    return env


def paused_export_build(monkeypatch):
    """Exports stop inside their build until `release` is set; `building` says one got there.
    For tests of what may happen to the cache while an export is being built."""
    import threading

    from oscar_zoo.zoo import export as export_mod

    building, release = threading.Event(), threading.Event()
    real_build = export_mod._build

    def slow_build(*args):
        building.set()
        release.wait(20)
        return real_build(*args)

    monkeypatch.setattr(export_mod, "_build", slow_build)
    return building, release


@contextlib.contextmanager
def pull_paused_after(monkeypatch, step: str, *args, **kwargs):
    """pull(*args, **kwargs) in a thread, stopped right after zoo.pull's `step` returns (the
    bundle is in the cache, its export not built yet). Yields a dict that holds the PullResult
    under "r" once the block ends (the pull is then let go and must have succeeded). For tests
    of what may happen to the cache while a pull is between its download and its export."""
    import threading

    from oscar_zoo.zoo import pull as pull_mod

    fetched, release = threading.Event(), threading.Event()
    real = getattr(pull_mod, step)

    def then_pause(*a, **kw):
        result = real(*a, **kw)
        fetched.set()
        release.wait(20)
        return result

    monkeypatch.setattr(pull_mod, step, then_pause)
    seen = {}

    def puller():
        try:
            seen["r"] = pull_mod.pull(*args, **kwargs)
        except Exception as e:  # reported below, after the test's own checks
            seen["error"] = e

    thread = threading.Thread(target=puller)
    thread.start()
    try:
        assert fetched.wait(30), "the pull never got to its pause"
        yield seen
    finally:
        release.set()
        thread.join(30)
    assert "error" not in seen, seen.get("error")
