"""The one settings registry: every knob has a name, a default, an env var and a help line.

The CLI (`oscar-zoo settings`), the docs table (docs/settings.md) and a doc test are all
generated from SETTINGS, so a setting cannot exist without being documented. Values are
read from the environment at call time, never cached at import, so tests and long-running
servers see changes.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from .errors import ConfigError, SettingError


@dataclass(frozen=True)
class Setting:
    name: str
    env: str
    default: str | None
    help: str
    kind: str = "str"  # str | int | float | bool | path | list
    secret: bool = False  # never printed or logged
    bound: str | None = None  # a number's range: ">0" or ">=N"
    choices: tuple[str, ...] = ()  # a str's only valid values


def _user_dir(xdg_env: str, fallback: str) -> str:
    base = os.environ.get(xdg_env) or os.path.join(os.path.expanduser("~"), fallback)
    return os.path.join(base, "oscar-zoo")


SETTINGS: tuple[Setting, ...] = (
    # where things live
    Setting("data_dir", "OSCAR_ZOO_DATA_DIR", None,
            "Registry data dir: SQLite database and blob store. Default: $XDG_DATA_HOME/oscar-zoo.",
            "path"),
    Setting("cache_dir", "OSCAR_ZOO_CACHE", None,
            "Client cache of pulled bundles. Default: $XDG_CACHE_HOME/oscar-zoo.", "path"),
    Setting("config_dir", "OSCAR_ZOO_CONFIG_DIR", None,
            "Client config (stored registry token). Default: $XDG_CONFIG_HOME/oscar-zoo.", "path"),
    Setting("database_url", "OSCAR_ZOO_DATABASE_URL", None,
            "SQLAlchemy URL of the registry database. Default: SQLite in the data dir.", "str"),
    # client
    Setting("endpoint", "OSCAR_ZOO_ENDPOINT", None,
            "Registry base URL for pull/list/show, e.g. http://127.0.0.1:8000.", "str"),
    Setting("token", "OSCAR_ZOO_TOKEN", None,
            "Registry API token; overrides the one stored by `oscar-zoo login`.", "str",
            secret=True),
    Setting("offline", "OSCAR_ZOO_OFFLINE", "0",
            "Serve from the local cache only; never touch the network.", "bool"),
    Setting("sources", "OSCAR_ZOO_SOURCES", "registry,hf,modelscope",
            "Where pull looks, in order (comma-separated: registry, hf, modelscope).", "list"),
    Setting("hf_zoo_repo", "OSCAR_ZOO_HF_ZOO_REPO", "Zhongzhu/OSCAR-RotationZoo",
            "Public RotationZoo repo on the Hugging Face Hub.", "str"),
    Setting("modelscope_zoo_repo", "OSCAR_ZOO_MODELSCOPE_ZOO_REPO",
            "togethercomputer/OSCAR-RotationZoo", "Public RotationZoo mirror on ModelScope.", "str"),
    Setting("hf_mirror_repo", "OSCAR_ZOO_HF_MIRROR_REPO", None,
            "An oscar-zoo mirror repo on the Hugging Face Hub (ORG/REPO) to pull from, tried "
            "first among the hub sources; `mirror` writes to the targets of --to or "
            "OSCAR_ZOO_MIRROR_TARGETS, not to this.", "str"),
    Setting("modelscope_mirror_repo", "OSCAR_ZOO_MODELSCOPE_MIRROR_REPO", None,
            "An oscar-zoo mirror repo on ModelScope (ORG/REPO) to pull from, tried first among "
            "the hub sources; `mirror` writes to the targets of --to or "
            "OSCAR_ZOO_MIRROR_TARGETS, not to this.", "str"),
    Setting("lock_timeout", "OSCAR_ZOO_LOCK_TIMEOUT", "120",
            "Seconds to wait for a cache lock before giving up.", "float", bound=">=0"),
    Setting("http_timeout", "OSCAR_ZOO_HTTP_TIMEOUT", "30",
            "Seconds without progress before a download is considered stalled.", "float", bound=">0"),
    Setting("http_retries", "OSCAR_ZOO_HTTP_RETRIES", "5",
            "Retries (with exponential backoff) for a failing download or upload; calls to the "
            "registry's and the hubs' APIs retry at most 3 times.", "int", bound=">=0"),
    # calibration
    Setting("calib_tokens", "OSCAR_ZOO_CALIB_TOKENS", "30000",
            "Default calibration token budget (OSCAR's default).", "int", bound=">0"),
    Setting("calib_seq_len", "OSCAR_ZOO_CALIB_SEQ_LEN", "2048",
            "Default calibration window length in tokens.", "int", bound=">0"),
    Setting("int2_backend", "OSCAR_ZOO_INT2_BACKEND", "auto",
            "INT2 round trip used by clip search and validation: triton (the kernels; on a CPU "
            "through Triton's interpreter, slow), vectorized (their torch twin), or auto "
            "(triton on CUDA, vectorized on CPU).", "str",
            choices=("auto", "triton", "vectorized")),
    # registry service
    Setting("max_upload_bytes", "OSCAR_ZOO_MAX_UPLOAD_BYTES", str(512 * 1024 * 1024),
            "Largest request body the registry accepts.", "int", bound=">0"),
    Setting("executor", "OSCAR_ZOO_EXECUTOR", "local",
            "Where calibration jobs run: local (worker processes beside the server) or ray.", "str",
            choices=("local", "ray")),
    Setting("ray_address", "OSCAR_ZOO_RAY_ADDRESS", None,
            "Ray cluster address for the ray executor (e.g. 127.0.0.1:6379).", "str"),
    Setting("ray_infeasible_seconds", "OSCAR_ZOO_RAY_INFEASIBLE_SECONDS", "300",
            "How long the ray executor lets a job's task wait when no alive node of the "
            "cluster has the resources it asks for (its gpus and ray_resources; Ray calls it "
            "infeasible) before it cancels the task and fails the job: an autoscaler's time to "
            "add such a node.", "float", bound=">0"),
    Setting("public_url", "OSCAR_ZOO_PUBLIC_URL", None,
            "Registry URL that workers on other hosts reach this server at (e.g. "
            "http://10.0.0.1:8000); the ray executor hands it to its tasks, and the web UI's "
            "copy-paste lines give it as OSCAR_ZOO_ENDPOINT. Default: the server's own "
            "(loopback) address for tasks, which only a single-host Ray cluster can reach, and "
            "the address each page was requested at for the UI.",
            "str"),
    Setting("workers", "OSCAR_ZOO_WORKERS", None,
            "Local worker processes started by `serve` (default: one per GPU, else one); with "
            "the ray executor, the most jobs its dispatcher keeps in flight (default: no cap).",
            "int", bound=">=0"),
    Setting("job_paths", "OSCAR_ZOO_JOB_PATHS", None,
            "Directories whose files a submitted job may name by path (a model directory or "
            ".gguf, .txt / .jsonl data), comma-separated, as the registry's host sees them. "
            "Unset: none; jobs name catalog models, hub ids, builtin: and hf: data.", "list"),
    Setting("job_lease_seconds", "OSCAR_ZOO_JOB_LEASE_SECONDS", "60",
            "A job lease expires this long after the last heartbeat.", "float", bound=">0"),
    Setting("job_max_attempts", "OSCAR_ZOO_JOB_MAX_ATTEMPTS", "3",
            "Attempts before a job is marked failed.", "int", bound=">=1"),
    Setting("job_cancel_grace_seconds", "OSCAR_ZOO_JOB_CANCEL_GRACE_SECONDS", "30",
            "After a cancel, seconds a job's process may take to stop by itself before its "
            "process group is killed.", "float", bound=">=0"),
    Setting("mirror_targets", "OSCAR_ZOO_MIRROR_TARGETS", None,
            "Mirror every published bundle to these (e.g. hf:org/repo,modelscope:org/repo).", "list"),
)

# Every setting `oscar-zoo serve` reads: the API, the job sweeper, the executors and the
# workers they start, mirroring after a publish. create_app checks them all (check), so a bad
# value stops the server at startup instead of failing requests one by one; a test keeps this
# list in step with what the server's modules read.
SERVICE: tuple[str, ...] = (
    "data_dir", "database_url", "max_upload_bytes", "executor", "ray_address",
    "ray_infeasible_seconds", "public_url", "workers", "job_paths", "job_lease_seconds",
    "job_max_attempts", "job_cancel_grace_seconds", "calib_tokens", "calib_seq_len",
    "mirror_targets", "lock_timeout", "http_timeout", "http_retries", "int2_backend",
)

_BY_NAME = {s.name: s for s in SETTINGS}
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def setting(name: str) -> Setting:
    try:
        return _BY_NAME[name]
    except KeyError:
        raise SettingError(f"unknown setting {name!r}; known: {', '.join(_BY_NAME)}") from None


def raw(name: str) -> str | None:
    s = setting(name)
    value = os.environ.get(s.env)
    return s.default if value is None else value


def shown(name: str):
    """A setting's value fit to print: a secret as ***, a URL's password (a database URL, an
    endpoint with user:password@) as ***."""
    if setting(name).secret:
        return "***" if raw(name) else None
    value = get(name)
    return redact_url(value) if isinstance(value, str) else value


def redact_url(url: str) -> str:
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        if not parts.password:
            return url
    except ValueError:  # not a URL urlsplit takes (broken brackets, a port that is no number):
        # mask whatever sits between "scheme://user:" and the last "@" all the same
        return re.sub(r"^([a-z][\w+.-]*://[^:/@]*):.*@", r"\1:***@", url, flags=re.I | re.S)
    netloc = f"{parts.username}:***@{parts.netloc.rpartition('@')[2]}"
    return parts._replace(netloc=netloc).geturl()


def get(name: str):
    """The typed value of a setting, read from the environment now."""
    s = setting(name)
    value = raw(name)
    if value is None:
        return _computed_default(name)
    try:
        converted = _convert(s, value)
    except ValueError:
        raise SettingError(f"{s.env}={value!r} is not a valid {s.kind}: use {_accepted(s)} "
                           f"({s.help})") from None
    if s.bound is not None and not _within(converted, s.bound):
        raise SettingError(f"{s.env}={value!r} is out of range: it must be a finite number "
                           f"{s.bound} ({s.help})")
    if s.choices and converted not in s.choices:
        raise SettingError(f"{s.env}={value!r} is not one of {', '.join(s.choices)}: {s.help}")
    return converted


def check(names: Iterable[str]) -> None:
    """Raise one SettingError naming every setting of `names` whose value is invalid, so that
    whoever fixes the first does not meet the next one on the following start."""
    problems = [p for p in map(_problem, names) if p]
    if len(problems) == 1:
        raise SettingError(problems[0])
    if problems:
        raise SettingError(f"{len(problems)} settings are invalid:\n  " + "\n  ".join(problems))


def _problem(name: str) -> str | None:
    try:
        value = get(name)
    except ConfigError as e:
        return str(e)
    wrong = _FORMATS[name](value) if name in _FORMATS and value is not None else None
    return f"{setting(name).env}={redact_url(raw(name))!r} is invalid: {wrong}" if wrong else None


def _mirror_targets(items: list[str]) -> str | None:
    from .mirror.runner import parse_target   # here: the mirror package imports this module

    for item in items:
        try:
            parse_target(item.partition("=")[2] if "=" in item else item)
        except ConfigError as e:
            return str(e)
    return None


def _http_url(url: str) -> str | None:
    try:
        parts = urlsplit(url)
        parts.port  # read for its check: urlsplit leaves a port that is no number unchecked
    except ValueError:  # that, or an unclosed [ of an IPv6 host
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        return "not an http(s) URL with a host (e.g. http://10.0.0.1:8000)"
    return None


# Checked at startup only, not by get(): a bad mirror target read after a publish must not
# fail the publish (registry_db/mirrors.py mirrors in the background and records the error).
_FORMATS = {"mirror_targets": _mirror_targets, "public_url": _http_url}


def _within(value: float, bound: str) -> bool:
    op, limit = (">=", float(bound[2:])) if bound.startswith(">=") else (">", float(bound[1:]))
    if not math.isfinite(value):
        return False
    return value >= limit if op == ">=" else value > limit


def _accepted(s: Setting) -> str:
    """What _convert takes for a setting of its kind (one it can refuse: a number or a bool)."""
    if s.kind == "bool":
        off = [word or "empty" for word in _FALSE]
        return f"{_either(_TRUE)} (any case) to turn it on; {_either(off)} to turn it off"
    number = "a whole number" if s.kind == "int" else "a number"
    return f"{number} {s.bound}" if s.bound else number


def _either(words) -> str:
    return f"{', '.join(words[:-1])} or {words[-1]}"


def _convert(s: Setting, value: str):
    if s.kind == "int":
        return int(value)
    if s.kind == "float":
        return float(value)
    if s.kind == "bool":
        low = value.strip().lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise ValueError(value)
    if s.kind == "path":
        return Path(value).expanduser()
    if s.kind == "list":
        return [v.strip() for v in value.split(",") if v.strip()]
    return value


def _computed_default(name: str):
    if name == "data_dir":
        return Path(_user_dir("XDG_DATA_HOME", ".local/share"))
    if name == "cache_dir":
        return Path(_user_dir("XDG_CACHE_HOME", ".cache"))
    if name == "config_dir":
        return Path(_user_dir("XDG_CONFIG_HOME", ".config"))
    if name == "database_url":
        return f"sqlite:///{get('data_dir') / 'registry.sqlite'}"
    return None


def is_offline() -> bool:
    """OSCAR_ZOO_OFFLINE, or the Hub's own HF_HUB_OFFLINE, both mean: cache only."""
    hf = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE
    return bool(get("offline")) or hf


def markdown_table() -> str:
    """The docs table of every setting (docs/settings.md is this, checked by a test)."""
    rows = ["| setting | env var | default | what it does |", "|---|---|---|---|"]
    for s in SETTINGS:
        default = (f"`{s.default}`" if s.default is not None
                   else "(computed)" if _computed_default(s.name) is not None else "unset")
        bound = f" Range: {s.bound}." if s.bound else ""
        bound += f" One of: {', '.join(s.choices)}." if s.choices else ""
        rows.append(f"| `{s.name}` | `{s.env}` | {default} | {s.help}{bound} |")
    return "\n".join(rows) + "\n"
