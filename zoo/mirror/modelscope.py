"""ModelScope as a mirror target, through modelscope-hub's HubApi: one commit per version (of
only the files that differ, and the deletions, in one request; see `commit`), then a tag.

ModelScope has no parent-commit check, so concurrent writers of one repo are serialized by the
registry's mirror runner (a lock per repo on the registry host, zoo/mirror/runner.py), not by
the hub.
"""

from __future__ import annotations

import base64
import tempfile
from pathlib import Path

from .layout import RepoFile
from ..sources.hubs import MSHub


# The description of a repo oscar-zoo creates. Set in the create request itself, so it is there
# even when the run dies before its first commit: a rerun tells its own repo (holding only what
# ModelScope put in it) from someone else's by it (`unfinished`).
CREATED_BY = "OSCAR rotation bundles (KV-cache INT2), mirrored by oscar-zoo"


class ModelScopeTarget:
    kind = "modelscope"

    def __init__(self, repo: str):
        self.repo = repo
        self.hub = MSHub()

    def exists(self) -> bool:
        with self.hub.errors(self.repo, None):
            return self.hub.api().repo_exists(self.repo, "model")

    def ensure_repo(self) -> bool:
        """Create the repo if it is missing; True when this call created it."""
        import modelscope_hub.errors as ms

        # asked first: a token that may write to this repo need not be allowed to create
        if self.exists():
            return False
        with self.hub.errors(self.repo, None):
            try:
                self.hub.api().create_repo(self.repo, "model", visibility="public",
                                           description=CREATED_BY)
            except ms.AlreadyExistsError:
                return False
        return True

    def unfinished(self) -> bool:
        """Whether an earlier run created this repo and stopped before its first version
        landed (killed between the create and the commit): the repo says oscar-zoo created it
        and has no tag. Whatever it holds is then the hub's starter content, as for a repo
        this run created (runner._push)."""
        with self.hub.errors(self.repo, None):
            info = self.hub.api().get_repo(self.repo, "model")
        return info.description == CREATED_BY and not self.tags()

    def tags(self) -> dict[str, str]:
        return self.hub.tags(self.repo)

    def head(self) -> str:
        return "master"  # ModelScope lists files by branch name; no commit id to pin

    def hashes(self, paths: list[str], revision: str) -> dict[str, tuple[str | None, str | None]]:
        listing = self.hub.listing(self.repo, paths, revision)
        return {p: (m.sha256, None) for p, m in listing.files.items()}

    def listdir(self, folder: str, revision: str) -> list[str]:
        """Paths of the files directly in `folder` at `revision`."""
        listing = self.hub.listing(self.repo, None, revision)
        return [p for p in listing.files if p.rpartition("/")[0] == folder]

    def paths(self, revision: str) -> list[str]:
        """Every file in the repo at `revision`."""
        return list(self.hub.listing(self.repo, None, revision).files)

    def read(self, path: str, revision: str) -> bytes | None:
        listing = self.hub.listing(self.repo, [path], revision)
        if path not in listing.files:
            return None
        meta = listing.files[path]
        with tempfile.TemporaryDirectory() as tmp, self.hub.errors(self.repo, revision):
            got = self.hub.api().download_file(self.repo, "model", path, revision=revision,
                                               local_dir=tmp, expected_sha256=meta.sha256,
                                               file_size=meta.size)
            return Path(got).read_bytes()

    def commit(self, files: list[RepoFile], message: str, parent: str | None,
               delete: list[str] = ()) -> str:
        """One commit of the whole change, added and deleted files together, or none.

        Not upload_folder: it commits the files that uploaded when another's blob fails (main
        would serve half a version, its index already listing it), it retries a commit whose
        answer was lost (a second commit; ModelScope has no parent check), and deleting takes
        a commit of its own (a crash between the two left a yanked version on main). Blobs go
        up first; the commit is then a single request that lands whole or not at all, and a
        re-run compares hashes before committing again (runner._push).
        """
        api = self.hub.api()
        with self.hub.errors(self.repo, "master"):
            self._upload_blobs(api, [f for f in files if _is_lfs(f)])
            actions = [_action(f, _is_lfs(f)) for f in files]
            actions += [_deletion(path) for path in delete]
            data = api.legacy.create_commit(self.repo, "model", actions, message,
                                            revision="master")
        if isinstance(data, dict):
            return str(data.get("CommitId") or data.get("oid") or "master")
        return "master"

    def _upload_blobs(self, api, files: list[RepoFile]) -> None:
        """Upload the LFS blobs the hub lacks."""
        unique = {f.sha256: f for f in files}
        if not unique:
            return
        urls = api.legacy.validate_blobs(
            self.repo, "model", [{"oid": sha, "size": len(f.data)} for sha, f in unique.items()])
        for sha, f in unique.items():
            if urls.get(sha):   # None or left out: the hub has it (hubs.md 2.3)
                api.legacy.upload_blob(urls[sha], f.data, len(f.data))

    def tag(self, tag: str, revision: str, message: str) -> None:
        with self.hub.errors(self.repo, revision):
            # Tag the branch we just wrote: ModelScope's tag API takes a branch (hubs.md 2.2).
            self.hub.api().create_repo_tag(self.repo, "model", tag, revision="master")

    def url(self, path: str, revision: str) -> str:
        return f"{self.hub.endpoint}/models/{self.repo}/files?Revision={revision}&FilePath={path}"


def _is_lfs(f: RepoFile) -> bool:
    """The client's own rule (modelscope_hub._upload._is_lfs), so the hub stores each file as
    upload_folder would: metadata it parses inline; large or binary-suffixed files as LFS."""
    from modelscope_hub import constants as c

    name = f.path.rsplit("/", 1)[-1]
    if name.upper() in c.UPLOAD_INLINE_METADATA_PATHS:
        return False
    suffix = Path(name).suffix.lower()
    return len(f.data) > c.UPLOAD_LFS_FORCE_THRESHOLD_BYTES or suffix in c.MODEL_LFS_SUFFIX


def _action(f: RepoFile, lfs: bool) -> dict:
    if lfs:
        return {"action": "create", "path": f.path, "type": "lfs", "size": len(f.data),
                "sha256": f.sha256, "content": "", "encoding": ""}
    return {"action": "create", "path": f.path, "type": "normal", "size": len(f.data),
            "sha256": "", "content": base64.b64encode(f.data).decode(), "encoding": "base64"}


def _deletion(path: str) -> dict:
    return {"action": "delete", "path": path, "type": "normal", "size": 0, "sha256": "",
            "content": "", "encoding": ""}
