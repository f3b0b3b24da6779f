"""`oscar-zoo worker` (zoo/cli/worker_cmd.py): one line at startup saying where it waits and as
whom, and help that says what --once does and which token it needs. The loop itself is
calibrate/executors/worker.py's (tests/jobs)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from oscar_zoo.calibrate.executors import worker as worker_mod
from oscar_zoo.zoo.cli.main import cli


@pytest.fixture
def loops(monkeypatch) -> list[tuple]:
    """The worker's main loop, replaced: each call's arguments, and no job waited for."""
    calls: list[tuple] = []
    monkeypatch.setattr(worker_mod, "main_loop", lambda *args: calls.append(args))
    return calls


def test_the_worker_says_at_once_where_it_waits_and_as_whom(loops, monkeypatch):
    """It printed nothing: 45 s of silence with --once and an empty queue."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    result = CliRunner().invoke(cli, ["worker", "--registry", "http://ops:Hunter2pw@reg:8000",
                                      "--once", "--worker-id", "gpu-7"])
    assert result.exit_code == 0, result.output
    assert result.stdout == ""
    assert result.stderr == ("oscar-zoo worker: waiting for one job at http://ops:***@reg:8000 "
                             "as worker gpu-7, on the CPU (no GPU visible)\n")
    assert loops == [("http://ops:Hunter2pw@reg:8000", None, None, "gpu-7", False, True)]


@pytest.mark.parametrize("gpus, visible, shown", [
    ("2", "0,1,2", "with 2 GPUs (--gpus 2)"), ("0", "0", "on the CPU (--gpus 0)"),
    (None, "0,1,2,3", "with every visible GPU (4)")])
def test_the_line_names_the_worker_it_runs_as_and_its_gpus(loops, monkeypatch, gpus, visible,
                                                           shown):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    args = ["worker", "--registry", "http://127.0.0.1:8000"] + (["--gpus", gpus] if gpus else [])
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    worker_id = loops[0][3]
    assert worker_id.startswith("worker:")     # the default id, made once: announced and used
    assert result.stderr == (f"oscar-zoo worker: waiting for jobs at http://127.0.0.1:8000 as "
                             f"worker {worker_id}, {shown}\n")


def test_a_gpu_count_this_host_lacks_is_refused_before_it_says_it_waits(loops, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    result = CliRunner().invoke(cli, ["worker", "--registry", "http://127.0.0.1:8000",
                                      "--gpus", "2"])
    assert result.exit_code == 1 and not loops
    assert result.stderr.startswith("Error: --gpus 2, but this worker sees 1 GPU"), result.stderr
    assert "waiting" not in result.stderr


def test_help_says_what_once_does_and_which_token_the_worker_needs():
    result = CliRunner().invoke(cli, ["worker", "--help"], terminal_width=100)
    text = " ".join(result.stdout.split())
    assert "--once Wait for one job, run it, then exit." in text
    assert "Needs a token with scope jobs:work: OSCAR_ZOO_TOKEN, or the one `oscar-zoo login` " \
           "stored" in text
