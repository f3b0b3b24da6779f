"""The emulator itself: in-memory git-like repos served over HF and ModelScope routes."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, quote, unquote, urlsplit

LFS_SUFFIXES = (".pt", ".safetensors", ".bin", ".pth", ".npy", ".gguf")
GITATTRIBUTES = "".join(f"*{s} filter=lfs diff=lfs merge=lfs -text\n" for s in LFS_SUFFIXES).encode()


def git_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class Commit:
    oid: str
    parent: str | None
    files: dict[str, tuple[bytes, bool]]     # path -> (content, stored as LFS)
    message: str
    created: float


@dataclass
class Repo:
    hub: str                                  # "hf" | "ms"
    repo_id: str
    commits: dict[str, Commit] = field(default_factory=dict)
    branches: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    description: str | None = None           # ModelScope's repo description (set at create)

    @property
    def default_branch(self) -> str:
        return "main" if self.hub == "hf" else "master"

    def resolve(self, rev: str | None) -> str | None:
        rev = rev or self.default_branch
        if rev in self.branches:
            return self.branches[rev]
        if rev in self.tags:
            return self.tags[rev]
        if rev in self.commits:
            return rev
        return None

    def files(self, rev: str | None = None) -> dict[str, tuple[bytes, bool]]:
        oid = self.resolve(rev)
        return {} if oid is None else self.commits[oid].files

    def commit(self, branch: str, files: dict[str, tuple[bytes, bool]], message: str) -> str:
        parent = self.branches.get(branch)
        oid = hashlib.sha1(f"{self.repo_id}{parent}{message}{uuid.uuid4()}".encode()).hexdigest()
        self.commits[oid] = Commit(oid, parent, files, message, time.time())
        self.branches[branch] = oid
        return oid


@dataclass
class Exchange:
    """One request and its answer, timed (time.monotonic()): when a retry came, not just
    whether it did."""
    method: str
    path: str
    arrived: float
    answered: float | None = None   # when the status line went out
    status: int | None = None


@dataclass
class Fault:
    method: str
    pattern: re.Pattern
    status: int | None = None       # answer with this status
    truncate: int | None = None     # or send only this many body bytes, then close
    corrupt: bool = False           # or flip one byte of the body
    delay: float | None = None      # or wait this long before answering (any method)
    stall: float | None = None      # or send `truncate` bytes then sleep this long
    lost: int | None = None         # or do the request, then answer this status instead
    retry_after: str | None = None  # Retry-After header of the `status` answer
    times: int | None = None        # None: forever
    hub: str | None = None          # "hf" | "ms" | None (both)


class HubEmulator:
    def __init__(self, token: str | None = None):
        self.repos: dict[tuple[str, str], Repo] = {}
        self.lfs: dict[str, dict[str, bytes]] = {"hf": {}, "ms": {}}  # uploaded LFS objects
        self.faults: list[Fault] = []
        self.log: list[tuple[str, str]] = []
        self.exchanges: list[Exchange] = []  # the log with times and statuses
        self.ranges: list[tuple[str, str]] = []  # (path, Range header) of ranged requests
        # when set, writes (and whoami) need `Authorization: Bearer <one of these>`
        self.tokens: set[str] = {token} if token else set()
        self.lock = threading.RLock()
        self.generation = 0                  # bumped by reset(): delayed requests then give up
        self.server: ThreadingHTTPServer | None = None
        self.starter_files = self._default_starters()

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> "HubEmulator":
        emulator = self

        class Handler(_Handler):
            emu = emulator

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True, name="hub-emulator").start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def __enter__(self) -> "HubEmulator":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def reset(self) -> None:
        with self.lock:
            self.generation += 1
            self.repos.clear()
            self.lfs = {"hf": {}, "ms": {}}
            self.faults.clear()
            self.log.clear()
            self.exchanges.clear()
            self.ranges.clear()
            self.tokens = set()
            self.starter_files = self._default_starters()

    @staticmethod
    def _default_starters() -> dict[str, dict[str, bytes]]:
        """What a hub commits into a repo it creates: the real Hub a .gitattributes (hubs.md
        1.5); ModelScope nothing here, though a test may make it seed a model card."""
        return {"hf": {".gitattributes": GITATTRIBUTES}, "ms": {}}

    # --- seeding and inspection --------------------------------------------------------------

    def repo(self, hub: str, repo_id: str, create: bool = False) -> Repo | None:
        with self.lock:
            key = (hub, repo_id)
            if key not in self.repos and create:
                repo = Repo(hub, repo_id)
                seed = {p: (data, False) for p, data in self.starter_files[hub].items()}
                repo.commit(repo.default_branch, seed, "initial commit")
                self.repos[key] = repo
            return self.repos.get(key)

    def seed(self, hub: str, repo_id: str, files: dict[str, bytes], message: str = "seed",
             tag: str | None = None) -> str:
        """Commit these files (added to what is there) on the default branch; return the oid."""
        with self.lock:
            repo = self.repo(hub, repo_id, create=True)
            current = dict(repo.files())
            for path, data in files.items():
                current[path] = (data, _is_lfs(path, data))
            oid = repo.commit(repo.default_branch, current, message)
            if tag:
                repo.tags[tag] = oid
            return oid

    def fail(self, method: str, pattern: str, status: int, times: int | None = None,
             hub: str | None = None, retry_after: float | str | None = None) -> None:
        """Answer `status` without doing the request; `retry_after` (seconds, or an HTTP-date)
        adds a Retry-After header, as a throttling hub does on a 429 or 503."""
        self.faults.append(Fault(method, re.compile(pattern), status=status, times=times, hub=hub,
                                 retry_after=None if retry_after is None else str(retry_after)))

    def truncate(self, pattern: str, after: int, times: int | None = 1, stall: float | None = None,
                 hub: str | None = None) -> None:
        self.faults.append(Fault("GET", re.compile(pattern), truncate=after, stall=stall,
                                 times=times, hub=hub))

    def delay(self, method: str, pattern: str, seconds: float, times: int | None = 1,
              hub: str | None = None) -> None:
        self.faults.append(Fault(method, re.compile(pattern), delay=seconds, times=times, hub=hub))

    def lose_response(self, method: str, pattern: str, status: int = 504, times: int | None = 1,
                      hub: str | None = None) -> None:
        """Carry the request out (a commit lands), then answer `status`: a gateway that timed
        out while the backend finished, so the client cannot tell it worked."""
        self.faults.append(Fault(method, re.compile(pattern), lost=status, times=times, hub=hub))

    def corrupt(self, pattern: str, times: int | None = 1, hub: str | None = None) -> None:
        self.faults.append(Fault("GET", re.compile(pattern), corrupt=True, times=times, hub=hub))

    def requests(self, method: str | None = None, pattern: str = "") -> list[str]:
        rx = re.compile(pattern)
        return [p for m, p in list(self.log) if (method is None or m == method) and rx.search(p)]

    def take_fault(self, method: str, path: str, hub: str) -> Fault | None:
        with self.lock:
            for f in self.faults:
                if f.method in (method, "*") and f.pattern.search(path) and f.hub in (None, hub):
                    if f.times is not None:
                        if f.times <= 0:
                            continue
                        f.times -= 1
                    return f
        return None


def _is_lfs(path: str, data: bytes) -> bool:
    return path.endswith(LFS_SUFFIXES) or len(data) > 10 * 1024 * 1024 or b"\0" in data[:512]


class HttpError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None,
                 headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.code = status, message, code
        self.headers = headers or {}


# --- the request handler -------------------------------------------------------------------

class _Handler(BaseHTTPRequestHandler):
    emu: HubEmulator
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # keep test output clean
        pass

    # dispatch

    def do_GET(self):
        self._dispatch("GET")

    def do_HEAD(self):
        self._dispatch("HEAD")

    def do_POST(self):
        self._dispatch("POST")

    def do_PUT(self):
        self._dispatch("PUT")

    def do_DELETE(self):
        self._dispatch("DELETE")

    def _dispatch(self, method: str):
        split = urlsplit(self.path)
        self.raw_path, self.query = split.path, parse_qs(split.query)
        self.emu.log.append((method, self.path))
        self.exchange = Exchange(method, self.path, time.monotonic())
        self.emu.exchanges.append(self.exchange)
        if self.headers.get("Range"):
            self.emu.ranges.append((self.path, self.headers["Range"]))
        self._body = None
        if method not in ("GET", "HEAD"):
            self.body()  # always drain it: the connection is kept alive for the next request
        hub = "ms" if self.raw_path.startswith(("/api/v1/", "/openapi/", "/_mslfs/")) else "hf"
        try:
            fault = self.emu.take_fault(method, self.path, hub)
            if fault is not None and fault.status is not None:
                self.body()  # drain the request
                headers = {"Retry-After": fault.retry_after} if fault.retry_after else None
                raise HttpError(fault.status, f"injected {fault.status}", headers=headers)
            self.fault = fault
            if fault is not None and fault.delay:
                generation, deadline = self.emu.generation, time.monotonic() + fault.delay
                while time.monotonic() < deadline and self.emu.generation == generation:
                    time.sleep(0.05)
                if self.emu.generation != generation:  # the test is over: answer nothing
                    self.close_connection = True
                    return
            if fault is not None and fault.lost is not None:
                self._answer_lost(hub, method, fault.lost)
            elif hub == "ms":
                self._modelscope(method)
            else:
                self._hf(method)
        except HttpError as e:
            self._error(hub, e)
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            self.exchange = None  # the next request on this connection is timed on its own

    def _answer_lost(self, hub: str, method: str, status: int):
        """Run the request with its answer thrown away, then answer `status`."""
        real, self.wfile = self.wfile, io.BytesIO()
        try:
            (self._modelscope if hub == "ms" else self._hf)(method)
        except HttpError:
            pass
        finally:
            self.wfile = real
        raise HttpError(status, f"injected {status} (the request was carried out)")

    # helpers

    def send_response(self, code, message=None):
        exchange = getattr(self, "exchange", None)  # None: a request too malformed to dispatch
        if exchange is not None:
            exchange.status, exchange.answered = code, time.monotonic()
        super().send_response(code, message)

    def body(self) -> bytes:
        if self._body is None:
            n = int(self.headers.get("Content-Length") or 0)
            self._body = self.rfile.read(n) if n else b""
        return self._body

    def json_body(self):
        try:
            return json.loads(self.body() or b"{}")
        except json.JSONDecodeError:
            raise HttpError(400, "invalid JSON body") from None

    def send(self, status: int, data: bytes = b"", headers: dict | None = None,
             content_type: str = "application/json"):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def send_json(self, obj, status: int = 200, headers: dict | None = None):
        self.send(status, json.dumps(obj).encode(), headers)

    def _authorized(self) -> bool:
        if not self.emu.tokens:
            return True
        return self.headers.get("Authorization") in {f"Bearer {t}" for t in self.emu.tokens}

    def require_auth(self):
        if not self._authorized():
            raise HttpError(401, "Invalid credentials in Authorization header")

    def _error(self, hub: str, e: HttpError):
        if hub == "ms":
            body = {"Code": e.status, "Message": e.message, "RequestId": uuid.uuid4().hex,
                    "Success": False}
            self.send_json(body, e.status, e.headers)
            return
        headers = {**e.headers, "X-Error-Message": e.message}
        if e.code:
            headers["X-Error-Code"] = e.code
        if e.code == "EntryNotFound" and getattr(self, "_commit", None):
            headers["X-Repo-Commit"] = self._commit
        self.send_json({"error": e.message}, e.status, headers)

    def send_file(self, data: bytes, headers: dict):
        """Serve bytes with Range support and the truncate/stall faults."""
        status, start, end = 200, 0, len(data) - 1
        rng = self.headers.get("Range")
        if rng:
            m = re.match(r"bytes=(\d+)-(\d*)$", rng.strip())
            if not m or int(m.group(1)) >= len(data) > 0:
                raise HttpError(416, "range not satisfiable")
            start = int(m.group(1))
            end = int(m.group(2)) if m.group(2) else len(data) - 1
            status = 206
            headers = dict(headers, **{"Content-Range": f"bytes {start}-{end}/{len(data)}"})
        chunk = data[start:end + 1]
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Accept-Ranges", "bytes")
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(chunk)))
        self.end_headers()
        if self.command == "HEAD":
            return
        fault = self.fault
        if fault is not None and fault.corrupt and chunk:
            chunk = bytes([chunk[0] ^ 0xFF]) + chunk[1:]
        if fault is not None and fault.truncate is not None and self.command == "GET":
            self.wfile.write(chunk[:fault.truncate])
            self.wfile.flush()
            if fault.stall:
                time.sleep(fault.stall)
            self.close_connection = True
            return
        self.wfile.write(chunk)

    # --- Hugging Face ------------------------------------------------------------------------

    def _hf(self, method: str):
        p = self.raw_path
        if p == "/api/validate-yaml" and method == "POST":
            return self.send_json({"errors": [], "warnings": []})
        if p == "/api/repos/create" and method == "POST":
            return self._hf_create()
        if p == "/api/whoami-v2":
            self.require_auth()
            return self.send_json({"type": "user", "name": "tester",
                                   "auth": {"accessToken": {"role": "write"}}})
        if "/xet-" in p:
            raise HttpError(501, "xet is not supported by this emulator")
        if p.startswith("/_lfs/"):
            return self._lfs_object(method, p[len("/_lfs/"):])
        m = re.match(r"^/api/(models|datasets|spaces)/([^/]+/[^/]+)(/.*)?$", p)
        if m:
            return self._hf_api(method, unquote(m.group(2)), m.group(3) or "")
        m = re.match(r"^/(?:datasets/|spaces/)?([^/]+/[^/]+?)\.git/info/lfs/objects/batch$", p)
        if m and method == "POST":
            return self._lfs_batch(self.json_body(), ms=False)
        m = re.match(r"^/(?:datasets/|spaces/)?([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", p)
        if m and method in ("GET", "HEAD"):
            return self._hf_resolve(unquote(m.group(1)), unquote(m.group(2)), unquote(m.group(3)))
        raise HttpError(404, f"no route for {method} {p}")

    def _hf_repo(self, repo_id: str) -> Repo:
        repo = self.emu.repo("hf", repo_id)
        if repo is None:
            raise HttpError(404, f"Repository {repo_id} not found", "RepoNotFound")
        return repo

    def _hf_rev(self, repo: Repo, rev: str | None) -> str:
        oid = repo.resolve(unquote(rev) if rev else None)
        if oid is None:
            raise HttpError(404, f"Revision {rev} not found", "RevisionNotFound")
        return oid

    def _hf_create(self):
        self.require_auth()
        body = self.json_body()
        repo_id = f"{body.get('organization') or 'tester'}/{body['name']}"
        url = f"{self._base()}/{repo_id}"
        with self.emu.lock:
            if self.emu.repo("hf", repo_id) is not None:
                return self.send_json({"error": "You already created this model repo", "url": url}, 409)
            self.emu.repo("hf", repo_id, create=True)
        self.send_json({"url": url})

    def _base(self) -> str:
        return f"http://{self.headers.get('Host')}"

    def _hf_api(self, method: str, repo_id: str, rest: str):
        if method == "GET" and (rest == "" or rest.startswith("/revision/")):
            repo = self._hf_repo(repo_id)
            return self._hf_info(repo, rest[len("/revision/"):] if rest else None)
        if method == "GET" and rest.startswith("/tree/"):
            return self._hf_tree(self._hf_repo(repo_id), rest[len("/tree/"):])
        if method == "POST" and rest.startswith("/paths-info/"):
            return self._hf_paths_info(self._hf_repo(repo_id), rest[len("/paths-info/"):])
        if method == "GET" and rest == "/refs":
            return self._hf_refs(self._hf_repo(repo_id))
        if method == "POST" and rest.startswith("/preupload/"):
            self.require_auth()
            return self._hf_preupload(self._hf_repo(repo_id), rest[len("/preupload/"):])
        if method == "POST" and rest.startswith("/commit/"):
            self.require_auth()
            return self._hf_commit(self._hf_repo(repo_id), unquote(rest[len("/commit/"):]))
        if rest.startswith("/tag/"):
            self.require_auth()
            return self._hf_tag(method, self._hf_repo(repo_id), unquote(rest[len("/tag/"):]))
        if method == "POST" and rest.startswith("/branch/"):
            self.require_auth()
            return self._hf_branch(self._hf_repo(repo_id), unquote(rest[len("/branch/"):]))
        raise HttpError(404, f"no route for {method} {self.raw_path}")

    def _entry(self, path: str, data: bytes, lfs: bool) -> dict:
        entry = {"type": "file", "oid": git_sha1(data), "size": len(data), "path": path}
        if lfs:
            entry["lfs"] = {"oid": sha256(data), "size": len(data), "pointerSize": 134}
        return entry

    def _hf_info(self, repo: Repo, rev: str | None):
        oid = self._hf_rev(repo, rev)
        commit = repo.commits[oid]
        siblings = []
        for path, (data, lfs) in sorted(commit.files.items()):
            s = {"rfilename": path, "size": len(data), "blobId": git_sha1(data)}
            if lfs:
                s["lfs"] = {"sha256": sha256(data), "size": len(data), "pointerSize": 134}
            siblings.append(s)
        self.send_json({"_id": repo.repo_id, "id": repo.repo_id, "modelId": repo.repo_id,
                        "sha": oid, "private": False, "disabled": False, "gated": False,
                        "downloads": 0, "likes": 0, "tags": [], "siblings": siblings,
                        "lastModified": _iso(commit.created), "createdAt": _iso(commit.created)})

    def _hf_tree(self, repo: Repo, rest: str):
        rev, _, prefix = rest.partition("/")
        files = repo.commits[self._hf_rev(repo, rev)].files
        prefix = unquote(prefix).strip("/")
        recursive = self.query.get("recursive", ["false"])[0].lower() == "true"
        out, dirs = [], set()
        for path, (data, lfs) in sorted(files.items()):
            if prefix and not path.startswith(prefix + "/"):
                continue
            rel = path[len(prefix) + 1:] if prefix else path
            if "/" in rel:
                first = (prefix + "/" if prefix else "") + rel.split("/")[0]
                if first not in dirs:
                    dirs.add(first)
                    out.append({"type": "directory", "oid": "0" * 40, "size": 0, "path": first})
                if not recursive:
                    continue
                parts = rel.split("/")
                for i in range(2, len(parts)):
                    d = (prefix + "/" if prefix else "") + "/".join(parts[:i])
                    if d not in dirs:
                        dirs.add(d)
                        out.append({"type": "directory", "oid": "0" * 40, "size": 0, "path": d})
            out.append(self._entry(path, data, lfs))
        if prefix and not out:
            raise HttpError(404, f"{prefix} does not exist", "EntryNotFound")
        self.send_json(out)

    def _hf_paths_info(self, repo: Repo, rev: str):
        files = repo.commits[self._hf_rev(repo, rev)].files
        ctype = self.headers.get("Content-Type", "")
        if "json" in ctype:
            paths = self.json_body().get("paths", [])
        else:
            paths = parse_qs(self.body().decode()).get("paths", [])
        out = [self._entry(p, *files[p]) for p in paths if p in files]
        self.send_json(out)

    def _hf_refs(self, repo: Repo):
        self.send_json({
            "branches": [{"name": b, "ref": f"refs/heads/{b}", "targetCommit": o}
                         for b, o in repo.branches.items()],
            "converts": [],
            "tags": [{"name": t, "ref": f"refs/tags/{t}", "targetCommit": o}
                     for t, o in repo.tags.items()],
            "pullRequests": []})

    def _hf_resolve(self, repo_id: str, rev: str, path: str):
        repo = self._hf_repo(repo_id)
        oid = self._hf_rev(repo, rev)
        self._commit = oid
        files = repo.commits[oid].files
        if path not in files:
            raise HttpError(404, f"Entry {path} not found", "EntryNotFound")
        data, lfs = files[path]
        headers = {"X-Repo-Commit": oid, "ETag": f'"{git_sha1(data)}"'}
        if lfs:
            headers["X-Linked-Etag"] = f'"{sha256(data)}"'
            headers["X-Linked-Size"] = str(len(data))
        self.send_file(data, headers)

    def _hf_preupload(self, repo: Repo, rev: str):
        files = repo.files(unquote(rev))
        out = []
        for f in self.json_body().get("files", []):
            sample = base64.b64decode(f.get("sample", ""))
            lfs = f["path"].endswith(LFS_SUFFIXES) or f.get("size", 0) > 10 * 1024 * 1024 \
                or b"\0" in sample
            current = files.get(f["path"])
            oid = None
            if current is not None:
                oid = sha256(current[0]) if lfs else git_sha1(current[0])
            out.append({"path": f["path"], "uploadMode": "lfs" if lfs else "regular",
                        "shouldIgnore": False, "oid": oid})
        self.send_json({"files": out, "commitOid": repo.resolve(unquote(rev))})

    def _lfs_batch(self, body: dict, ms: bool):
        objects = []
        base = self._base()
        for o in body.get("objects", []):
            entry = {"oid": o["oid"], "size": o["size"]}
            if o["oid"] not in self.emu.lfs["ms" if ms else "hf"]:
                if ms:
                    entry["actions"] = {"upload": {"href": f"{base}/_mslfs/{o['oid']}"}}
                else:
                    entry["authenticated"] = True
                    entry["actions"] = {"upload": {"href": f"{base}/_lfs/{o['oid']}", "header": {}},
                                        "verify": {"href": f"{base}/_lfs/verify"}}
            objects.append(entry)
        if ms:
            return self.send_json({"Code": 200, "Data": {"objects": objects}, "Success": True})
        self.send(200, json.dumps({"transfer": "basic", "objects": objects}).encode(),
                  content_type="application/vnd.git-lfs+json")

    def _lfs_object(self, method: str, oid: str):
        if method == "POST" and oid == "verify":
            body = self.json_body()
            if body.get("oid") not in self.emu.lfs["hf"]:
                raise HttpError(404, "object not uploaded")
            return self.send_json({})
        if method == "PUT":
            data = self.body()
            if sha256(data) != oid:
                raise HttpError(400, "content does not match its oid")
            with self.emu.lock:
                self.emu.lfs["hf"][oid] = data
            return self.send(200, b"")
        raise HttpError(404, "no such LFS route")

    def _hf_commit(self, repo: Repo, branch: str):
        lines = [json.loads(line) for line in self.body().splitlines() if line.strip()]
        header = next((ln["value"] for ln in lines if ln["key"] == "header"), {})
        with self.emu.lock:
            head = repo.branches.get(branch)
            if head is None:
                raise HttpError(404, f"Revision {branch} not found", "RevisionNotFound")
            parent = header.get("parentCommit")
            if parent and parent != head:
                raise HttpError(412, f"A commit has happened since {parent}: {branch} is at {head}")
            files = dict(repo.files(branch))
            for ln in lines:
                key, v = ln["key"], ln["value"]
                if key == "file":
                    files[v["path"]] = (base64.b64decode(v["content"]), False)
                elif key == "lfsFile":
                    if v["oid"] not in self.emu.lfs["hf"]:
                        raise HttpError(422, f"LFS object {v['oid']} was never uploaded")
                    files[v["path"]] = (self.emu.lfs["hf"][v["oid"]], True)
                elif key == "deletedFile":
                    files.pop(v["path"], None)
                elif key == "deletedFolder":
                    for path in [p for p in files if p.startswith(v["path"].rstrip("/") + "/")]:
                        files.pop(path)
            oid = repo.commit(branch, files, header.get("summary", ""))
        self.send_json({"commitOid": oid, "commitUrl": f"{self._base()}/{repo.repo_id}/commit/{oid}",
                        "pullRequestUrl": None})

    def _hf_tag(self, method: str, repo: Repo, arg: str):
        with self.emu.lock:
            if method == "DELETE":
                if arg not in repo.tags:
                    raise HttpError(404, f"tag {arg} not found", "RevisionNotFound")
                del repo.tags[arg]
                return self.send_json({})
            body = self.json_body()
            tag, oid = body["tag"], self._hf_rev(repo, arg)
            if tag in repo.tags:
                raise HttpError(409, f"Tag {tag} already exists")
            repo.tags[tag] = oid
        self.send_json({})

    def _hf_branch(self, repo: Repo, name: str):
        body = self.json_body()
        with self.emu.lock:
            if name in repo.branches:
                raise HttpError(409, f"Branch {name} already exists")
            repo.branches[name] = self._hf_rev(repo, body.get("startingPoint"))
        self.send_json({})

    # --- ModelScope --------------------------------------------------------------------------

    def _ms_ok(self, data, status: int = 200):
        self.send_json({"Code": 200, "Data": data, "Message": "success",
                        "RequestId": uuid.uuid4().hex, "Success": True}, status)

    def _ms_repo(self, repo_id: str) -> Repo:
        repo = self.emu.repo("ms", repo_id)
        if repo is None:
            raise HttpError(404, f"model {repo_id} does not exist")
        return repo

    def _modelscope(self, method: str):
        p = self.raw_path
        if p == "/api/v1/repos/internalAccelerationInfo":
            raise HttpError(404, "not on an internal network")
        if p == "/openapi/v1/users/me":
            self.require_auth()
            return self._ms_ok({"Username": "tester", "Name": "tester"})
        if p == "/api/v1/login" and method == "POST":
            return self._ms_ok({"Username": "tester", "AccessToken": self.json_body().get("AccessToken")})
        if p.startswith("/_mslfs/") and method == "PUT":
            self.require_auth()
            data, oid = self.body(), p[len("/_mslfs/"):]
            if sha256(data) != oid:
                raise HttpError(400, "content does not match its oid")
            with self.emu.lock:
                self.emu.lfs["ms"][oid] = data
            return self._ms_ok({})
        if p == "/api/v1/models" and method == "POST":
            return self._ms_create()
        m = re.match(r"^/api/v1/repos/models/([^/]+/[^/]+)/info/lfs/objects/batch$", p)
        if m and method == "POST":
            self.require_auth()
            self._ms_repo(unquote(m.group(1)))
            return self._lfs_batch(self.json_body(), ms=True)
        m = re.match(r"^/api/v1/repos/models/([^/]+/[^/]+)/commit/(.+)$", p)
        if m and method == "POST":
            self.require_auth()
            return self._ms_commit(self._ms_repo(unquote(m.group(1))), unquote(m.group(2)))
        m = re.match(r"^/(?:api/v1|openapi/v1)/models/([^/]+/[^/]+)(/.*)?$", p)
        if m:
            return self._ms_model(method, self._ms_repo(unquote(m.group(1))), m.group(2) or "")
        raise HttpError(404, f"no route for {method} {p}")

    def _ms_create(self):
        self.require_auth()
        body = self.json_body()
        repo_id = f"{body['Path']}/{body['Name']}"
        with self.emu.lock:
            if self.emu.repo("ms", repo_id) is not None:
                raise HttpError(400, f"model {repo_id} already exists")
            self.emu.repo("ms", repo_id, create=True).description = body.get("Description")
        self._ms_ok({"Path": body["Path"], "Name": body["Name"]})

    def _ms_rev(self, repo: Repo) -> str:
        rev = (self.query.get("Revision") or [None])[0]
        oid = repo.resolve(rev)
        if oid is None:
            raise HttpError(404, f"revision {rev} does not exist")
        return oid

    def _ms_model(self, method: str, repo: Repo, rest: str):
        if rest == "" and method == "GET":
            return self._ms_ok({"Name": repo.repo_id.split("/")[1], "Path": repo.repo_id.split("/")[0],
                                "Id": repo.repo_id, "Visibility": 5,
                                "Description": repo.description})
        if rest == "/revisions" and method == "GET":
            def rows(refs):
                return [{"Revision": n, "CommitId": o, "CreatedAt": int(repo.commits[o].created)}
                        for n, o in refs.items()]
            return self._ms_ok({"RevisionMap": {"Tags": rows(repo.tags), "Branches": rows(repo.branches)}})
        if rest == "/repo/files" and method == "GET":
            files = repo.commits[self._ms_rev(repo)].files
            out, dirs = [], set()
            for path, (data, _lfs) in sorted(files.items()):
                parts = path.split("/")
                for i in range(1, len(parts)):
                    d = "/".join(parts[:i])
                    if d not in dirs:
                        dirs.add(d)
                        out.append({"Name": parts[i - 1], "Path": d, "Type": "tree", "Size": 0})
                out.append({"Name": parts[-1], "Path": path, "Type": "blob", "Size": len(data),
                            "Sha256": sha256(data), "Revision": self._ms_rev(repo)})
            return self._ms_ok({"Files": out})
        if rest == "/repo" and method in ("GET", "HEAD"):
            path = (self.query.get("FilePath") or [""])[0]
            files = repo.commits[self._ms_rev(repo)].files
            if path not in files:
                raise HttpError(404, f"file {path} does not exist")
            data = files[path][0]
            return self.send_file(data, {"ETag": f'"{sha256(data)}"'})
        if rest == "/repo/tag" and method == "POST":
            self.require_auth()
            body = self.json_body()
            with self.emu.lock:
                if body["TagName"] in repo.tags:
                    raise HttpError(400, f"tag {body['TagName']} already exists")
                oid = repo.resolve(body.get("Ref"))
                if oid is None:
                    raise HttpError(404, f"revision {body.get('Ref')} does not exist")
                repo.tags[body["TagName"]] = oid
            return self._ms_ok({"TagName": body["TagName"], "Ref": body.get("Ref")})
        raise HttpError(404, f"no route for {method} {self.raw_path}")

    def _ms_commit(self, repo: Repo, revision: str):
        body = self.json_body()
        with self.emu.lock:
            if revision not in repo.branches:
                raise HttpError(404, f"revision {revision} does not exist")
            files = dict(repo.files(revision))
            for a in body.get("actions", []):
                if a["action"] == "delete":
                    files.pop(a["path"], None)
                elif a.get("type") == "lfs":
                    if a["sha256"] not in self.emu.lfs["ms"]:
                        raise HttpError(400, f"LFS object {a['sha256']} was never uploaded")
                    files[a["path"]] = (self.emu.lfs["ms"][a["sha256"]], True)
                else:
                    files[a["path"]] = (base64.b64decode(a.get("content", "")), False)
            oid = repo.commit(revision, files, body.get("commit_message", ""))
        self._ms_ok({"oid": oid, "CommitId": oid})


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(t))


def quote_rev(rev: str) -> str:
    return quote(rev, safe="")
