"""ModelScope as a mirror target, through modelscope-hub's HubApi: one upload_folder per version
(of only the files that differ, staged in a temp dir laid out like the repo), then a tag.

Its upload cache is off (`use_cache=False`): the tracker it would write is keyed by path, size
and mtime, not by endpoint or revision, and could skip files silently (hubs.md 2.2). ModelScope
has no parent-commit check, so concurrent writers of one repo are serialized by the registry's
mirror runner (a lock per repo on the registry host, zoo/mirror/runner.py), not by the hub.
"""

from __future__ import annotations

import tempfile
from contextlib import redirect_stdout
from pathlib import Path

from ..errors import RemoteError
from .layout import RepoFile
from ..sources.hubs import MSHub


class ModelScopeTarget:
    kind = "modelscope"

    def __init__(self, repo: str):
        self.repo = repo
        self.hub = MSHub()

    def ensure_repo(self) -> bool:
        """Create the repo if it is missing; True when this call created it."""
        import modelscope_hub.errors as ms

        with self.hub.errors(self.repo, None):
            # asked first: a token that may write to this repo need not be allowed to create
            if self.hub.api().repo_exists(self.repo, "model"):
                return False
            try:
                self.hub.api().create_repo(self.repo, "model", visibility="public")
            except ms.AlreadyExistsError:
                return False
        return True

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
        result = None
        with tempfile.TemporaryDirectory() as tmp, self.hub.errors(self.repo, "master"):
            for f in files:
                dest = Path(tmp, f.path)
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(f.data)
            if files:
                with _stdout_to_stderr():
                    result = self.hub.api().upload_folder(
                        self.repo, "model", tmp, commit_message=message, revision="master",
                        use_cache=False, disable_tqdm=True)
            if delete:
                # A second commit (upload_folder cannot delete); a crash between the two
                # leaves the stale files for the next run to find and delete.
                with _stdout_to_stderr():
                    gone = self.hub.api().delete_files(self.repo, "model", list(delete),
                                                       commit_message=message,
                                                       revision="master")
                if gone.get("failed_files"):
                    raise RemoteError(f"modelscope:{self.repo}: could not delete "
                                      f"{gone['failed_files']}")
        if isinstance(result, list):
            result = result[-1] if result else None
        if isinstance(result, dict):
            return str(result.get("CommitId") or result.get("oid") or "master")
        return "master"

    def tag(self, tag: str, revision: str, message: str) -> None:
        with self.hub.errors(self.repo, revision):
            # Tag the branch we just wrote: ModelScope's tag API takes a branch (hubs.md 2.2).
            self.hub.api().create_repo_tag(self.repo, "model", tag, revision="master")

    def url(self, path: str, revision: str) -> str:
        return f"{self.hub.endpoint}/models/{self.repo}/files?Revision={revision}&FilePath={path}"


def _stdout_to_stderr():
    """modelscope-hub prints an "Upload Report" to stdout; stdout is for our output (the JSON
    of `oscar-zoo mirror --json`)."""
    import sys

    return redirect_stdout(sys.stderr)
