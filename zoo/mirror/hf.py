"""The Hugging Face Hub as a mirror target: one create_commit per version (with parent_commit,
so a concurrent writer makes us re-read and retry instead of overwriting), then a tag.

Uploads go over plain LFS, never xet: HF_HUB_DISABLE_XET is forced on here so production takes
the same code path the loopback tests cover (bundles are a few MB; hubs.md 1.3).
"""

from __future__ import annotations

from .layout import RepoFile
from ..sources.hubs import HFHub


class HFTarget:
    kind = "hf"

    def __init__(self, repo: str):
        self.repo = repo
        self.hub = HFHub()

    def api(self):
        import huggingface_hub.constants as constants

        constants.HF_HUB_DISABLE_XET = True  # read at call time (hubs.md 1.3)
        return self.hub.api()

    def exists(self) -> bool:
        with self.hub.errors(self.repo, None):
            return self.api().repo_exists(self.repo, repo_type="model")

    def ensure_repo(self) -> bool:
        """Create the repo if it is missing; True when this call created it."""
        # asked first: a token that may write to this repo need not be allowed to create
        if self.exists():
            return False
        with self.hub.errors(self.repo, None):
            self.api().create_repo(self.repo, repo_type="model", exist_ok=True)
        return True

    def unfinished(self) -> bool:
        """The Hub starts a repo with a .gitattributes only (runner.SEED_FILES), which a rerun
        into a repo an earlier run created and left before its first commit accepts anyway."""
        return False

    def tags(self) -> dict[str, str]:
        with self.hub.errors(self.repo, None):
            refs = self.api().list_repo_refs(self.repo)
        return {t.name: t.target_commit for t in refs.tags}

    def head(self) -> str:
        with self.hub.errors(self.repo, "main"):
            return self.api().repo_info(self.repo, revision="main").sha

    def hashes(self, paths: list[str], revision: str) -> dict[str, tuple[str | None, str | None]]:
        """path -> (sha256 if LFS, git blob sha1) for the paths that exist at `revision`."""
        with self.hub.errors(self.repo, revision):
            found = self.api().get_paths_info(self.repo, paths, revision=revision)
        return {f.path: (f.lfs.sha256 if getattr(f, "lfs", None) else None, f.blob_id)
                for f in found if getattr(f, "size", None) is not None}

    def listdir(self, folder: str, revision: str) -> list[str]:
        """Paths of the files directly in `folder` at `revision` ([] when it does not exist)."""
        from ..errors import BundleNotFound

        try:
            with self.hub.errors(self.repo, revision):
                found = list(self.api().list_repo_tree(self.repo, folder, revision=revision))
        except BundleNotFound:
            return []
        return [f.path for f in found if getattr(f, "size", None) is not None]

    def paths(self, revision: str) -> list[str]:
        """Every file in the repo at `revision`."""
        with self.hub.errors(self.repo, revision):
            found = list(self.api().list_repo_tree(self.repo, recursive=True, revision=revision))
        return [f.path for f in found if getattr(f, "size", None) is not None]

    def read(self, path: str, revision: str) -> bytes | None:
        """A file at `revision` (the index; a version's files, a few MB, that a yank puts back
        on main from its tag), or None when it does not exist there."""
        from ..errors import OfflineError, RemoteError
        from ..sources.download import http_client, import_httpx
        from ..sources.hubs import FileMeta

        listing = self.hashes([path], revision)
        if path not in listing:
            return None
        sha, git = listing[path]
        remote = self.hub.remote(self.repo, FileMeta(path, 0, sha, git), revision)
        try:
            r = http_client().get(remote.url, headers=remote.headers)
        except import_httpx().TransportError as e:
            raise OfflineError(f"hf:{self.repo}: cannot read {path} ({type(e).__name__})") from None
        if r.status_code >= 400:
            raise RemoteError(f"hf:{self.repo}@{revision}: reading {path} gave {r.status_code}")
        # What the listing says it is, or nothing: a damaged index taken as unreadable would
        # have every other entry dropped from the one written back.
        got = RepoFile.of(path, r.content)
        if (got.sha256 if sha else got.git_sha1) != (sha or git):
            raise RemoteError(f"hf:{self.repo}@{revision}: {path} as downloaded does not match "
                              "the hash the Hub lists for it (damaged in transit?); try again")
        return r.content

    def commit(self, files: list[RepoFile], message: str, parent: str | None,
               delete: list[str] = ()) -> str:
        from huggingface_hub import CommitOperationAdd, CommitOperationDelete

        ops = [CommitOperationAdd(path_in_repo=f.path, path_or_fileobj=f.data) for f in files]
        ops += [CommitOperationDelete(path_in_repo=path) for path in delete]
        with self.hub.errors(self.repo, "main"):
            try:
                info = self.api().create_commit(self.repo, operations=ops,
                                                commit_message=message, parent_commit=parent,
                                                repo_type="model")
            except RuntimeError as e:
                # A failed LFS upload comes wrapped in a bare RuntimeError ("Error while
                # uploading X to the Hub"); its cause says what the storage answered (a 403, a
                # 5xx worth another try, no connection), which the errors above word and retry.
                if isinstance(e.__cause__, Exception):
                    raise e.__cause__ from None
                raise
        return info.oid

    def tag(self, tag: str, revision: str, message: str) -> None:
        with self.hub.errors(self.repo, revision):
            self.api().create_tag(self.repo, tag=tag, revision=revision, tag_message=message,
                                  repo_type="model")

    def url(self, path: str, revision: str) -> str:
        return f"{self.hub.endpoint}/{self.repo}/tree/{revision}/{path}"
