"""Mirror published versions to the Hugging Face Hub and ModelScope, and record where they went.

    mirror_bundle(bundle_dir, number=3, target="hf:org/rotations")   # one bundle dir, one hub
    plan_bundle(bundle_dir, number=3, target="hf:org/rotations")     # what it would do there

The registry side (resolve a version, record the outcome, mirror after publish) is in
registry_db/mirrors.py: `mirror_version`, `mirror_after_publish`.

Per target, a run is idempotent: it first compares the hub's file hashes (and tags) with what
it would upload, so a re-run after a crash commits only what is missing, tags only if the tag
is missing, and a finished version is left alone (no new commit, no new tag). Transient hub
errors (429, 5xx, connection errors) are retried with backoff; a failing hub never blocks the
other, and every outcome lands in the registry's mirror records (GET .../mirrors). A plan
(`oscar-zoo mirror --dry-run`) reads the hub exactly as a run does, through the same step
function, and writes nothing.

Targets: `--to` arguments, else the mirror_targets setting (OSCAR_ZOO_MIRROR_TARGETS), whose
entries are `hf:ORG/REPO` or `modelscope:ORG/REPO` for every model, or `GLOB=hf:ORG/REPO` for
the models matching GLOB (`glm-*=modelscope:org/glm-rotations`).
"""

from __future__ import annotations

import fnmatch
import json
import logging
import re
import threading
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

from .. import settings
from ..errors import Conflict, ConfigError, NotFound, OscarZooError, RemoteError
from ..sources.download import backoff, retry_transient
from . import layout

log = logging.getLogger("oscar_zoo.mirror")
KINDS = ("hf", "modelscope")
CONFLICT_RETRIES = 3
_OSCAR_PT = re.compile(r"^[kv]_rotation.*\.pt$")
SEED_FILES = {".gitattributes"}   # what a hub puts in a new repo (hubs.md 1.5)
OUTCOME = "oscar_zoo_mirror_outcome"   # marks a log record that reports a target's outcome


@dataclass
class MirrorResult:
    target: str                 # hf | modelscope
    repo: str
    status: str                 # done | failed | skipped (nothing to do there; `note` says why)
    path: str | None = None     # folder in the repo
    revision: str | None = None  # the hub commit of this version (its tag points at it)
    tag: str | None = None
    url: str | None = None
    committed: bool = False     # False: the hub already had it (nothing uploaded)
    error: str | None = None
    note: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class MirrorPlan:
    """What a mirror run would do on one target (`--dry-run`): read from the hub, not done."""
    target: str                 # hf | modelscope
    repo: str
    model: str
    version: int
    action: str                 # commit and tag | commit | tag | record yank | nothing | skip | fail
    folder: str | None = None   # the version's folder in the repo
    tag: str | None = None
    create_repo: bool = False   # the repo does not exist yet: the run would create it
    upload: list[str] = field(default_factory=list)   # paths it would commit (new or changed)
    delete: list[str] = field(default_factory=list)   # paths that commit would remove
    note: str | None = None     # why nothing (or skip)
    error: str | None = None    # why it would fail

    def of(self, step: _Step, commit: str, tag_only: str | None,
           done: str = "the hub already has all of it") -> "MirrorPlan":
        """Filled in from a step: `commit` where it has files to commit or delete, else
        `tag_only` where only the tag is missing, else nothing (`done` says why)."""
        self.folder, self.tag = step.folder, step.tag
        self.upload, self.delete = [f.path for f in step.changed], list(step.stale)
        if step.changed or step.stale:
            self.action = commit
        elif tag_only and not step.finished:
            self.action = tag_only
        else:
            self.action, self.note = "nothing", done
        return self

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class _Step:
    """What one attempt at mirroring a version must do, as read from the hub (nothing written):
    a push carries it out, a dry run shows it."""
    head: str
    folder: str | None
    tag: str
    tagged: str | None          # the commit the tag points at, when the tag exists
    changed: list[layout.RepoFile] = field(default_factory=list)   # to commit
    stale: list[str] = field(default_factory=list)                 # to delete in that commit
    finished: bool = False      # tagged, and main's index lists it: nothing left to do


def parse_target(spec: str) -> tuple[str, str]:
    """`hf:org/repo` -> ("hf", "org/repo"). Raises ConfigError."""
    kind, _, repo = spec.strip().partition(":")
    kind = {"huggingface": "hf", "ms": "modelscope"}.get(kind, kind)
    if kind not in KINDS or repo.count("/") != 1 or not all(repo.split("/")):
        raise ConfigError(f"bad mirror target {spec!r}: use hf:ORG/REPO or modelscope:ORG/REPO")
    return kind, repo


def configured_targets(model: str) -> list[str]:
    out = []
    for item in settings.get("mirror_targets") or []:
        pattern, eq, target = item.partition("=")
        if not eq:
            pattern, target = "*", item
        if fnmatch.fnmatch(model.lower(), pattern.strip().lower()):
            parse_target(target)
            out.append(target.strip())
    return list(dict.fromkeys(out))


def open_target(kind: str, repo: str):
    if kind == "hf":
        from .hf import HFTarget

        return HFTarget(repo)
    from .modelscope import ModelScopeTarget

    return ModelScopeTarget(repo)


# --- one version to one hub --------------------------------------------------------------------

def mirror_bundle(bundle_dir: str | Path, number: int, target: str,
                  model: str | None = None) -> MirrorResult:
    """Mirror the bundle in `bundle_dir` (version `number` of `model`) to one target.

    `model` is the registry's name of the model (default: the one bundle.json gives); tags and
    index entries go by it, so a bundle naming its model by an alias joins the same versions.
    Raises nothing for hub failures: they come back as status "failed" with the reason.
    """
    kind, repo = parse_target(target)
    bundle_dir = Path(bundle_dir)
    manifest, digest = _read_manifest(bundle_dir)
    hub = open_target(kind, repo)
    model = model or manifest["model"]["name"]
    try:
        # once, outside the push's retries: a retry would find the repo this run created and
        # take the hub's starter files in it for someone else's
        created = _with_retries(hub.ensure_repo)
        return _with_retries(lambda: _push(hub, bundle_dir, manifest, digest, number, model, created))
    except Exception as e:  # one hub's failure is recorded, never raised to the other
        reason = _reason(e, model, number)
        log.warning("mirroring %s v%s to %s failed: %s", model, number, target, reason,
                    extra={OUTCOME: True})
        return MirrorResult(kind, repo, "failed", error=reason)


def mark_yanked(target: str, model: str, number: int, reason: str) -> MirrorResult:
    """Record in one target's index that `model` v`number` was yanked, so a pull from the
    mirror stops offering it as latest and warns; and, in the same commit, take it off the main
    branch when its folder there holds it (layout.main_holder: the folder gets the newest
    version of it not yanked back from that version's tag, or is emptied). Tags are never
    touched. A repo whose index does not hold the version is left alone. Like mirror_bundle,
    hub failures come back as status "failed"."""
    kind, repo = parse_target(target)
    hub = open_target(kind, repo)
    try:
        return _with_retries(lambda: _push_yank(hub, model, number, reason))
    except Exception as e:
        reason_ = _reason(e, model, number)
        log.warning("recording the yank of %s v%s on %s failed: %s", model, number, target,
                    reason_, extra={OUTCOME: True})
        return MirrorResult(kind, repo, "failed", error=reason_)


def _read_manifest(bundle_dir: Path) -> tuple[dict, str]:
    """bundle.json parsed, and its sha256 (the bundle's digest)."""
    import hashlib

    raw = (bundle_dir / "bundle.json").read_bytes()
    return json.loads(raw), hashlib.sha256(raw).hexdigest()


# --- the same, planned: read from the hub, nothing written (`oscar-zoo mirror --dry-run`) -------

def plan_bundle(bundle_dir: str | Path, number: int, target: str,
                model: str | None = None) -> MirrorPlan:
    """What mirror_bundle would do on one target now: the hub's repo, index and tags are read
    (a repo that does not exist is planned as the empty one it would create), and nothing is
    written. A hub that cannot be read, or a run that would be refused, comes back as action
    "fail" with the reason."""
    kind, repo = parse_target(target)
    bundle_dir = Path(bundle_dir)
    manifest, digest = _read_manifest(bundle_dir)
    model = model or manifest["model"]["name"]
    hub = open_target(kind, repo)
    plan = MirrorPlan(kind, repo, model, number, "fail", tag=layout.tag_name(model, number))
    try:
        exists = _with_retries(hub.exists)
        seen = hub if exists else _NewRepo(hub)
        step = _with_retries(lambda: _next_step(seen, bundle_dir, manifest, digest, number,
                                                model, created=not exists))
    except Exception as e:  # planned like the run would have ended: a reason, not a traceback
        plan.error = _reason(e, model, number)
        return plan
    plan.create_repo = not exists
    return plan.of(step, "commit and tag" if not step.tagged else "commit",
                   None if step.tagged else "tag")


def plan_yank(target: str, model: str, number: int, reason: str) -> MirrorPlan:
    """What mark_yanked would change on one target now (read from the hub, nothing written)."""
    kind, repo = parse_target(target)
    hub = open_target(kind, repo)
    plan = MirrorPlan(kind, repo, model, number, "fail", tag=layout.tag_name(model, number))
    try:
        step = _with_retries(lambda: _yank_step(hub, model, number, reason))
    except Exception as e:
        plan.error = _reason(e, model, number)
        return plan
    if step is None:
        plan.action, plan.note = "nothing", f"its {layout.INDEX} does not list this version"
        return plan
    return plan.of(step, "record yank", None, "the yank is already recorded there")


class _NewRepo:
    """A repo a mirror run would create, as a dry run sees it: empty, with no tags."""

    def __init__(self, hub):
        self.kind, self.repo = hub.kind, hub.repo

    def head(self) -> str:
        return "main"

    def read(self, path: str, revision: str) -> None:
        return None

    def tags(self) -> dict:
        return {}

    def hashes(self, paths: list[str], revision: str) -> dict:
        return {}

    def listdir(self, folder: str, revision: str) -> list[str]:
        return []

    def unfinished(self) -> bool:
        return True


# --- run outcomes in the log ------------------------------------------------------------------

@contextmanager
def outcomes_reported_by_caller():
    """While inside, on this thread, a target's failure is not logged: the caller (the CLI)
    prints every target's outcome itself, and the same reason twice, once as a log warning
    on stderr and once in its own line, read as two failures. Background mirrors on the
    server, which nobody else reports, keep logging theirs."""
    thread = threading.get_ident()

    def keep(record: logging.LogRecord) -> bool:
        return not (getattr(record, OUTCOME, False) and record.thread == thread)

    log.addFilter(keep)
    try:
        yield
    finally:
        log.removeFilter(keep)


def _reason(e: Exception, model: str, number: int) -> str:
    """What a failed run records and prints. A 429 still there after the retries (or one asking
    for a longer wait than a run sits out) is the hub throttling this token, for minutes: say
    so, how long it asked for, and that a later re-run is safe."""
    if not isinstance(e, OscarZooError):
        return f"{type(e).__name__}: {e}"
    rerun = (f"run `oscar-zoo mirror {model}@{number}` again (it uploads and commits only what "
             "the hub lacks)")
    asked = getattr(e, "retry_after", None) if isinstance(e, RemoteError) else None
    if isinstance(e, RemoteError) and getattr(e, "status", None) == 429:
        wait = "that long" if asked is not None else "a few minutes"
        return f"{e}; the hub is rate-limiting this token: wait {wait}, then {rerun}"
    if asked is not None:   # the message says how long (hubs._http_error)
        return f"{e}: after that, {rerun}"
    return str(e)


def _push_yank(hub, model: str, number: int, reason: str) -> MirrorResult:
    for _ in range(CONFLICT_RETRIES):
        step = _yank_step(hub, model, number, reason)
        if step is None:   # never mirrored here: nothing to take back
            return MirrorResult(hub.kind, hub.repo, "done")
        committed = bool(step.changed or step.stale)
        if committed:
            try:
                hub.commit(step.changed, f"oscar-zoo: {model} v{number} yanked: {reason}"[:200],
                           parent=step.head, delete=step.stale)
            except Conflict:
                continue
        return MirrorResult(hub.kind, hub.repo, "done", committed=committed)
    raise Conflict(f"{hub.kind}:{hub.repo}: the main branch kept moving during "
                   f"{CONFLICT_RETRIES} attempts; try again")


def _yank_step(hub, model: str, number: int, reason: str) -> _Step | None:
    """What recording the yank still needs on the hub (read, nothing written): the index and
    landing page, and the version's folder on main restored or emptied; None where the index
    does not hold the version."""
    head = hub.head()
    index = _loaded(hub, hub.read(layout.INDEX, head))
    slot = index["models"].get(model)
    if slot is not None and not layout.readable_slot(slot):
        # a yank reported done that took nothing off main would be worse than a failure
        raise Conflict(f"{hub.kind}:{hub.repo}: {layout.INDEX} lists {model} in a form "
                       "oscar-zoo does not write (another tool's keys or entries among its "
                       "versions), so the yank was not recorded; mirror a version of the "
                       "model there again (that rewrites its entry), then yank again")
    entry = layout.mark_yanked(index, model, number, reason)
    if entry is None:
        return None
    # Compared with main on every run, not only the first: a re-run after a failure (or
    # after a yank recorded by an older oscar-zoo) finishes what is missing. Its own folder,
    # and the one above a v<N> folder: an earlier yank may have put this version back there
    restored, removed = [], []
    for folder in layout.folders_of(entry.get("path")):
        got, gone = _folder_after_yank(hub, _index_versions(index, model), folder, head,
                                       f"{model} v{number}")
        restored, removed = restored + got, removed + gone
    wanted = _index_files(index, hub)
    remote = hub.hashes([f.path for f in wanted], head)
    changed = restored + [f for f in wanted if not _same(remote.get(f.path), f)]
    path, tag = entry.get("path"), entry.get("tag")
    return _Step(head, path if isinstance(path, str) else None,
                 tag if isinstance(tag, str) else layout.tag_name(model, number), None,
                 changed, removed)


def _folder_after_yank(hub, versions: dict, folder, head: str,
                       what: str) -> tuple[list[layout.RepoFile], list[str]]:
    """What `folder` on main needs once the version last mirrored into it is yanked: the files
    of the version that takes its place (those that differ from main's), and the paths to
    delete (every file directly in it when none takes its place; its v<N> subfolders hold
    versions of their own). ([], []) while that version is not yanked: main serves a live one."""
    top = layout.last_mirrored_into(versions, folder) if isinstance(folder, str) else None
    if top is None or not versions[top].get("yanked"):
        return [], []
    holder = layout.replacement(versions, folder)
    sources = _tagged_sources(hub, versions[holder], folder, what) if holder else {}
    on_main = hub.hashes(list(sources), head) if sources else {}
    restored = [_read_tagged(hub, dst, src, versions[holder]["tag"], what)
                for dst, (src, hashes) in sources.items() if on_main.get(dst) != hashes]
    removed = sorted(p for p in hub.listdir(folder, head) if p not in sources)
    return restored, removed


def _tagged_sources(hub, entry: dict, folder: str, what: str) -> dict:
    """path in `folder` -> (path at the entry's tag, its hashes there), for each of its files.
    Hashes, not bytes: a re-run whose folder already matches downloads nothing."""
    tag = entry["tag"]
    paths = {f"{folder}/{n}": f"{entry['path']}/{n}" for n in sorted(entry["files"])}
    try:
        at_tag = hub.hashes(list(paths.values()), tag)
    except NotFound:   # the tag itself is gone
        at_tag = {}
    missing = [p for p in paths.values() if p not in at_tag]
    if missing:
        raise Conflict(f"{hub.kind}:{hub.repo}: after the yank of {what}, {folder} on the main "
                       f"branch should hold v{entry.get('version')} again, but its tag {tag} "
                       f"lacks {', '.join(missing)}; nothing was changed. Restore the tag on "
                       "the hub (or remove that version from oscar-zoo.json), then run "
                       f"`oscar-zoo mirror` on the yanked version again")
    return {dst: (src, at_tag[src]) for dst, src in paths.items()}


def _read_tagged(hub, dst: str, src: str, tag: str, what: str) -> layout.RepoFile:
    data = hub.read(src, tag)
    if data is None:   # listed a moment ago: someone is editing the tag
        raise Conflict(f"{hub.kind}:{hub.repo}: {src} vanished from tag {tag} while the yank "
                       f"of {what} was restoring it; run `oscar-zoo mirror` on the yanked "
                       "version again")
    return layout.RepoFile.of(dst, data)


def _loaded(hub, index_bytes: bytes | None) -> dict:
    try:
        return layout.load_index(index_bytes)
    except layout.UnreadableIndex as e:
        raise Conflict(f"{hub.kind}:{hub.repo}: {layout.INDEX} on the main branch cannot be "
                       f"read: {e}. Rewriting it would drop every other version it lists, so "
                       "nothing was changed: repair it on the hub (its history has the last "
                       "good copy), then mirror again") from None


def _tag_index(hub, revision: str) -> dict:
    """The index as a tag left it; only read for where it put the version, so an unreadable
    one just says nothing (the main branch's is the one that must be sound)."""
    try:
        return layout.load_index(hub.read(layout.INDEX, revision))
    except layout.UnreadableIndex:
        return layout.load_index(None)


def _with_retries(fn):
    # backs off further than a download: a retry here redoes a whole push, listings included;
    # said on stderr, as a hub that is down would keep `mirror` silent for minutes
    return retry_transient(fn, int(settings.get("http_retries")),
                           wait=partial(backoff, base=0.5, most=30.0), loud=True)


def _same(remote: tuple[str | None, str | None] | None, f: layout.RepoFile) -> bool:
    if remote is None:
        return False
    sha256, git_sha1 = remote
    return sha256 == f.sha256 if sha256 else git_sha1 == f.git_sha1


def _push(hub, bundle_dir: Path, manifest: dict, digest: str, number: int,
          model: str, created: bool) -> MirrorResult:
    """created: this run made the repo (or hub.unfinished(): an earlier run did, and was killed
    before its first commit), so whatever it holds is the hub's starter content (ModelScope may
    add a model card), which the mirror's own README.md replaces."""
    for _ in range(CONFLICT_RETRIES):
        step = _next_step(hub, bundle_dir, manifest, digest, number, model, created)
        folder, tag = step.folder, step.tag
        if step.finished:
            return MirrorResult(hub.kind, hub.repo, "done", folder, step.tagged, tag,
                                hub.url(folder, tag))
        committed = bool(step.changed or step.stale)
        if committed:
            try:
                revision = hub.commit(step.changed, f"oscar-zoo: {model} v{number} "
                                                    f"(sha256:{digest[:12]})", parent=step.head,
                                      delete=step.stale)
            except Conflict:
                continue  # the branch moved under us: re-read the index and try again
        else:
            revision = step.head  # a previous run committed, then stopped before tagging
        if step.tagged:
            return MirrorResult(hub.kind, hub.repo, "done", folder, step.tagged, tag,
                                hub.url(folder, tag), committed)
        hub.tag(tag, revision, f"{model} v{number}, bundle sha256:{digest}")
        if revision in ("master", "main"):  # ModelScope's upload may not name its commit
            revision = hub.tags().get(tag, revision)
        # the tag alone changed the hub too: a run that finishes an earlier one stopped before
        # its tag (whose index already listed the version) is not "already there"
        return MirrorResult(hub.kind, hub.repo, "done", folder, revision, tag,
                            hub.url(folder, tag), True,
                            note=None if committed else "tagged only: its files were already on the main branch")
    raise Conflict(f"{hub.kind}:{hub.repo}: the main branch kept moving during "
                   f"{CONFLICT_RETRIES} attempts; try again")


def _next_step(hub, bundle_dir: Path, manifest: dict, digest: str, number: int, model: str,
               created: bool) -> _Step:
    """Read the hub's main branch, index and tags, and work out what mirroring this version
    still needs there. Raises ConfigError for someone else's repo, Conflict for a tag holding
    other files."""
    tag = layout.tag_name(model, number)
    head = hub.head()
    index_bytes = hub.read(layout.INDEX, head)
    if index_bytes is None and not (created or hub.unfinished()):
        _refuse_foreign(hub, head)
    index = _loaded(hub, index_bytes)
    folder = _folder_for(index, manifest, number, model)
    tagged = hub.tags().get(tag)
    if tagged:
        # Compare where the tag put it: an older version re-mirrored after a newer one took
        # its folder would otherwise be looked for in a v<N> subfolder it never had.
        folder = _recorded_folder(_tag_index(hub, tagged), model, number) or folder
    files = layout.version_files(bundle_dir, manifest, folder)
    entry = layout.index_entry(manifest, digest, number, files, folder, model)
    if tagged:  # mirrored before (perhaps by a run that crashed after tagging)
        _check_tagged(hub, tagged, tag, files)
        if _indexed(index, model, number, digest):
            return _Step(head, folder, tag, tagged, finished=True)
        files = []  # the index lost it: record it again, leave main's folder as it is
    index = layout.updated_index(index_bytes, manifest, entry, model)
    wanted = files + _index_files(index, hub)
    remote = hub.hashes([f.path for f in wanted], head)
    changed = [f for f in wanted if not _same(remote.get(f.path), f)]
    stale = _stale_rotations(hub.listdir(folder, head), folder, wanted) if files else []
    return _Step(head, folder, tag, tagged, changed, stale)


def _index_files(index: dict, hub) -> list[layout.RepoFile]:
    """The index and the landing page rendered from it, in that hub's words."""
    return [layout.RepoFile.of(layout.INDEX, layout.dump_index(index)),
            layout.RepoFile.of(layout.ROOT_README,
                               layout.render_root_readme(index, hub.repo, hub.kind))]


def _check_tagged(hub, revision: str, tag: str, files: list[layout.RepoFile]) -> None:
    remote = hub.hashes([f.path for f in files], revision)
    if not all(_same(remote.get(f.path), f) for f in files):
        raise Conflict(f"{hub.kind}:{hub.repo}: tag {tag} exists but holds other files "
                       "than this version; tags are never moved, so delete it on the hub "
                       "if it is wrong and mirror again")


def _indexed(index: dict, model: str, number: int, digest: str) -> bool:
    """Whether the main branch's index still lists this version (a pull finds it by it)."""
    entry = _index_versions(index, model).get(str(number))
    return isinstance(entry, dict) and entry.get("digest") == digest


def _refuse_foreign(hub, head: str) -> None:
    """A repo with content but no index is someone else's (a typo in a target, a job spec
    naming any repo the server's token can write): the root README.md and the RotationZoo
    folders would overwrite theirs. Only the hub's own seed (.gitattributes) may be there
    (in a repo the run did not create itself)."""
    theirs = sorted(p for p in hub.paths(head) if p not in SEED_FILES)
    if theirs:
        shown = ", ".join(theirs[:5]) + (f" and {len(theirs) - 5} more" if len(theirs) > 5 else "")
        raise ConfigError(
            f"{hub.kind}:{hub.repo} is not an oscar-zoo mirror: it holds files ({shown}) but no "
            f"{layout.INDEX}, and mirroring would overwrite its README.md; nothing was changed. "
            "Check the target (--to, OSCAR_ZOO_MIRROR_TARGETS or the job's `mirror`), or mirror "
            "into a new or empty repo (if an older oscar-zoo created this one and stopped "
            "before its first commit, delete the files the hub put there, or the repo, and "
            "mirror again)")


def _stale_rotations(listed: list[str], folder: str, wanted: list[layout.RepoFile]) -> list[str]:
    """OSCAR .pt files an older version left in the folder (a per-layer pair under a per-head
    one, ...): engine scripts pick k_rotation_*.pt by name, so they must not outlive it."""
    keep = {f.path for f in wanted}
    return sorted(p for p in listed if p not in keep and p.rpartition("/")[0] == folder
                  and _OSCAR_PT.match(p.rpartition("/")[2]))


def _index_versions(index: dict, model: str) -> dict[str, dict]:
    """This model's versions in a hub index; {} where it records none that can be read (a
    hand-edited entry, which updated_index rebuilds)."""
    slot = index["models"].get(model)
    return slot["versions"] if layout.readable_slot(slot) else {}


def _recorded_folder(index: dict, model: str, number: int) -> str | None:
    """The folder an index records for this version, if it records one."""
    path = _index_versions(index, model).get(str(number), {}).get("path")
    return path if isinstance(path, str) else None


def _folder_for(index: dict, manifest: dict, number: int, model: str) -> str:
    """The RotationZoo folder, unless a newer version of the model already holds it there:
    then this (older) one goes to a v<N> subfolder, so the main branch never rolls back. A
    yanked version holds nothing (its yank restored or emptied the folder)."""
    folder = f"{_model_folder(index, manifest, model)}/{layout.calibration_tag(manifest)}"
    holder = layout.main_holder(_index_versions(index, model), folder)
    return f"{folder}/v{number}" if holder is not None and int(holder) > number else folder


def _model_folder(index: dict, manifest: dict, model: str) -> str:
    """The model's top folder; org-qualified (unsloth--SmolLM2-135M-Instruct) when another
    model's versions already live under the plain one (two hub ids with one repo name), which
    this model's files would otherwise overwrite."""
    plain = layout.model_folder(manifest)
    taken = _folders_of_others(index, model)
    if plain not in taken:
        return plain
    qualified = manifest["model"]["hub_id"].replace("/", "--")
    if qualified in taken:
        raise Conflict(f"{model}: the folders {plain}/ and {qualified}/ of this repo both hold "
                       "another model's versions (see its oscar-zoo.json); mirror it to "
                       "another repo")
    return qualified


def _folders_of_others(index: dict, model: str) -> set[str]:
    out = set()
    for name, slot in index["models"].items():
        if name == model or not layout.readable_slot(slot):
            continue
        for e in slot["versions"].values():
            if isinstance(e.get("path"), str):  # another tool's entry may lack it
                out.add(e["path"].split("/")[0])
    return out
