"""`oscar-zoo calibrate | validate`: how the CLI wires its options into a calibration.

The calibration and validation themselves are replaced here: they take minutes on a CPU and are
tested for real in tests/calibrate (and run end to end by `make demo`). What is tested is what
the command passes them, what it writes and when."""

from __future__ import annotations

import json
import os
import re
import sys
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

import oscar_zoo.calibrate.loading as loading
import oscar_zoo.calibrate.pipeline as pipeline
import oscar_zoo.calibrate.validate as validate_mod
from oscar_zoo.zoo import bundle as bundle_mod
from oscar_zoo.zoo.cli import calibrate_cmds
from oscar_zoo.zoo.cli.main import cli
from oscar_zoo.zoo.errors import InvalidInput
from tests.utils.bundles import make_bundle


class Stop(Exception):
    pass


def _capture_config(monkeypatch) -> list:
    seen = []

    def calibrate(cfg, progress=None, loaded=None, text=None):
        seen.append(cfg)
        raise Stop

    monkeypatch.setattr(pipeline, "calibrate", calibrate)
    return seen


@pytest.mark.parametrize("model, sink, recent, group, other", [
    ("qwen3-30b-a3b", 128, 1024, 128, 64), ("gemma-4-12b", 64, 512, 256, 128),   # head_dim 512: >= 128
    ("qwen3-8b", 64, 256, 128, 64)])
def test_calibrate_simulates_the_cache_the_model_is_served_with(monkeypatch, tmp_path, model,
                                                                sink, recent, group, other):
    """The command used 64 / 256 / 128 for every model while a job used the catalog's, so the
    clip search was tuned for windows OSCAR does not serve that model with."""
    seen = _capture_config(monkeypatch)
    r = CliRunner().invoke(cli, ["calibrate", model, "--out", str(tmp_path / "b")])
    assert isinstance(r.exception, Stop), r.output
    assert (seen[0].sink_tokens, seen[0].recent_tokens, seen[0].group_size) == (sink, recent, group)
    r = CliRunner().invoke(cli, ["calibrate", model, "--group-size", str(other), "--out",
                                 str(tmp_path / "b")])
    assert isinstance(r.exception, Stop), r.output
    assert seen[1].group_size == other


@pytest.mark.parametrize("flag", ["--tokens", "--seq-len", "--group-size"])
def test_a_zero_budget_is_refused_not_replaced_by_the_default(monkeypatch, tmp_path, flag):
    seen = _capture_config(monkeypatch)
    r = CliRunner().invoke(cli, ["calibrate", "qwen3-8b", flag, "0", "--out", str(tmp_path / "b")])
    assert r.exit_code == 2 and flag in r.output and not seen


def test_calibrate_validate_loads_once_and_keeps_the_bundle_when_validation_fails(monkeypatch,
                                                                               tmp_path):
    """--validate reloaded the model by the manifest's short name (a local .gguf: not found; a
    local fine-tune named like a catalog model: the hub's weights) after calibrating, and an
    error there lost the calibration, written only at the very end."""
    made = bundle_mod.read(make_bundle(tmp_path / "made", model="qwen3-8b").path)
    loads, calls = [], []
    monkeypatch.setattr(loading, "load_model", lambda src: loads.append(src) or ("M", "T"))

    def calibrate(cfg, progress=None, loaded=None, text=None):
        calls.append(loaded)
        return SimpleNamespace(bundle=made, tokens_per_pass=1, timings={"total": 1.0})

    def validate(bundle, model, tok, cfg, quantizer, progress=None, text=None):
        calls.append((model, tok))
        raise InvalidInput("held-out text too short")

    monkeypatch.setattr(pipeline, "calibrate", calibrate)
    monkeypatch.setattr(validate_mod, "validate", validate)
    monkeypatch.setattr(calibrate_cmds, "_quantizer", lambda bundle, model: None)
    out = tmp_path / "out"
    r = CliRunner().invoke(cli, ["calibrate", "qwen3-8b", "--revision", "abc123", "--validate",
                                 "--out", str(out)])
    assert r.exit_code == 1 and "held-out text too short" in r.stderr, r.output
    assert [(s.path, s.revision) for s in loads] == [("Qwen/Qwen3-8B", "abc123")]
    assert calls == [("M", "T"), ("M", "T")]
    assert bundle_mod.read(out).manifest.model.name == "qwen3-8b"  # written and verified


def test_validate_of_a_bundle_from_a_local_model_asks_for_model(tmp_path):
    b = make_bundle(tmp_path / "b", model="qwen3-8b")
    manifest = bundle_mod.read(b.path).manifest
    local = manifest.model_copy(update={"model": manifest.model.model_copy(update={"name": "my-ft"})})
    with pytest.raises(Exception) as e:
        calibrate_cmds._bundle_model(local.model, None)
    assert "pass --model" in str(e.value)
    assert calibrate_cmds._bundle_model(manifest.model, None).path == "Qwen/Qwen3-8B"


@pytest.mark.parametrize("passed, code", [(True, 0), (False, 1)])
def test_validate_exits_1_when_the_bundle_fails(monkeypatch, tmp_path, passed, code):
    """It exited 0 either way, so `oscar-zoo validate B && oscar-zoo publish B` published a
    bundle that had just failed."""
    b = make_bundle(tmp_path / "b", model="qwen3-8b")
    monkeypatch.setattr(loading, "load_model", lambda src: ("M", "T"))
    monkeypatch.setattr(calibrate_cmds, "_quantizer", lambda bundle, model: None)
    report = SimpleNamespace(passed=passed, criterion="extra loss <= Hadamard's + 0.05 nats",
                             model_dump=lambda mode: {"passed": passed})
    monkeypatch.setattr(validate_mod, "validate", lambda *a, **k: report)
    r = CliRunner().invoke(cli, ["validate", str(b.path), "--no-write", "--json"])
    assert r.exit_code == code, r.output
    assert json.loads(r.stdout) == {"passed": passed}           # the report is printed either way
    assert ("validation failed" in r.stderr) == (not passed)


def test_validate_takes_the_text_field_its_error_asks_for(monkeypatch, tmp_path):
    b = make_bundle(tmp_path / "b", model="qwen3-8b")
    seen = []
    monkeypatch.setattr(loading, "load_model", lambda src: ("M", "T"))
    monkeypatch.setattr(calibrate_cmds, "_quantizer", lambda bundle, model: None)

    def validate(bundle, model, tok, cfg, quantizer, progress=None, text=None):
        seen.append(cfg)
        raise Stop

    monkeypatch.setattr(validate_mod, "validate", validate)
    (tmp_path / "d.jsonl").write_text('{"content": "held-out prose"}\n')
    data = str(tmp_path / "d.jsonl")
    r = CliRunner().invoke(cli, ["validate", str(b.path), "--data", data, "--text-field", "content"])
    assert isinstance(r.exception, Stop), r.output
    assert seen[0].text_field == "content" and seen[0].data == [data]


@pytest.mark.parametrize("args, says", [
    (["validate", "{b}", "--windows", "0"], "windows 0"),
    (["validate", "{b}", "--context-len", "256"], "must exceed sink 64 + recent 256 = 320; raise --context-len"),
    (["calibrate", "qwen3-8b", "--seq-len", "256", "--validate", "--out", "{o}"], "Raise --seq-len above 320"),
])
def test_lengths_that_measure_nothing_are_refused_before_the_model_loads(monkeypatch, tmp_path,
                                                                         args, says):
    b = make_bundle(tmp_path / "b", model="qwen3-8b")

    def load_model(src):
        raise AssertionError("the model was loaded before the settings were checked")

    monkeypatch.setattr(loading, "load_model", load_model)
    argv = [a.format(b=b.path, o=tmp_path / "o") for a in args]
    r = CliRunner().invoke(cli, argv)
    assert r.exit_code == 1 and says in r.stderr, r.output


@pytest.mark.parametrize("model, flags, lloyd", [
    ("minimax-m2.7", [], True), ("qwen3.5-35b-a3b", [], True),   # OSCAR serves them so
    ("minimax-m2.7", ["--uniform"], False),
    ("smollm2-135m", [], False), ("smollm2-135m", ["--lloyd-max"], True)])
def test_calibrate_takes_lloyd_max_from_the_catalog_unless_told(monkeypatch, tmp_path, model,
                                                                 flags, lloyd):
    """The command calibrated every model for uniform INT2, Lloyd-Max served or not."""
    seen = _capture_config(monkeypatch)
    r = CliRunner().invoke(cli, ["calibrate", model, *flags, "--out", str(tmp_path / "b")])
    assert isinstance(r.exception, Stop), r.output
    assert seen[0].lloyd_max is lloyd


def test_calibrate_refuses_lloyd_max_with_groups_before_loading(monkeypatch, tmp_path):
    def never(*a, **k):
        raise AssertionError("the model was loaded before the group size was checked")

    monkeypatch.setattr(loading, "load_model", never)
    monkeypatch.setattr(pipeline, "load_model", never)
    seen = _capture_config(monkeypatch)
    r = CliRunner().invoke(cli, ["calibrate", "qwen3.5-35b-a3b", "--group-size", "128", "--out",
                                 str(tmp_path / "b")])
    assert r.exit_code == 1 and "lloyd_max needs group_size == head_dim" in r.stderr, r.output
    assert "--uniform" in r.stderr and not seen
    r = CliRunner().invoke(cli, ["calibrate", "qwen3.5-35b-a3b", "--group-size", "128",
                                 "--uniform", "--out", str(tmp_path / "b")])
    assert isinstance(r.exception, Stop), r.output


def test_validation_in_the_cli_uses_the_bundles_quantizer(monkeypatch, tmp_path):
    """It built kernel_quantizer(scale dtype): uniform INT2 for a Lloyd-Max bundle too. The
    stand-in bundle_quantizer records its call."""
    import oscar_zoo.calibrate.int2_attention as int2_attention

    b = bundle_mod.read(make_bundle(tmp_path / "b", model="qwen3-8b").path)
    calls = []
    monkeypatch.setattr(int2_attention, "bundle_quantizer",
                        lambda manifest, device=None: calls.append((manifest, device)) or "q",
                        raising=False)
    assert calibrate_cmds._quantizer(b, SimpleNamespace(device="cuda:1")) == "q"
    assert calls == [(b.manifest, "cuda:1")]


def _report(**extra) -> dict:
    return {"context_len": 2048, "sink_tokens": 128, "recent_tokens": 1024, "group_size": 128,
            "scale_dtype": "float32", "bits_int2_tier": 2.5, "bits_at_context": 9.0,
            "eval_tokens": 12288, "dataset": "builtin:pydoc", "bf16_nll": 2.0, "variants": [],
            "passed": True, "criterion": "extra loss <= Hadamard's + 0.05 nats", **extra}


@pytest.mark.parametrize("extra, says", [({"quantizer": "lloyd_max"}, "Lloyd-Max INT2 buckets"),
                                         ({"quantizer": "uniform"}, "uniform INT2"),
                                         ({}, "uniform INT2")])   # a report from before the field
def test_the_validate_report_says_which_quantizer_it_simulated(extra, says):
    first = calibrate_cmds._human_report(_report(**extra)).splitlines()[0]
    assert first.startswith("context 2048 (sink 128, recent 1024") and says in first


def test_the_validate_report_says_what_its_bits_per_element_count():
    """It printed "2.50 bits in the INT2 tier, 9.00 at this context": neither what an element
    is, nor that the scale and zero are in, nor what the second figure averages over."""
    second = calibrate_cmds._human_report(_report()).splitlines()[1]
    assert second == ("cache bits 2.50 per K/V element in the INT2 tier (2-bit codes + float32 "
                      "scale and zero per 128 elements); 9.00 per element of a whole 2048-token "
                      "cache, its BF16 sink 128 + recent 1024 included (rotations and key mean: "
                      "per layer, not counted)")


@pytest.mark.parametrize("windows, says", [
    ({str(i): 512 for i in range(20)} | {"20": 4096}, "cache (20 sliding-window layers hold 512 tokens), its"),
    ({"0": 4096}, "cache, its"),                  # a window past the context holds all of it
    ({}, "cache, its")])
def test_the_validate_report_says_which_layers_held_fewer_tokens(windows, says):
    """A model with sliding-window layers has a higher whole-cache figure than its sink and
    recent explain: "a whole 2048-token cache" was not one in those layers."""
    second = calibrate_cmds._human_report(_report(window_by_layer=windows)).splitlines()[1]
    assert f"9.00 per element of a whole 2048-token {says} BF16 sink 128" in second


@pytest.mark.parametrize("command", ["calibrate", "validate"])
@pytest.mark.parametrize("content, says", [
    (None, "no such file"),
    ('{"body": "prose"}\n', r"d.jsonl:1: no string field 'text' \(set --text-field\)"),
    ("", "d.jsonl holds no text")])
def test_bad_data_is_refused_before_the_model_loads(monkeypatch, tmp_path, command, content, says):
    """The text was read only after the model had loaded (minutes for an 8B model), and for
    `calibrate --validate` after the load that both steps share."""
    def never(*a, **k):
        raise AssertionError("the model was loaded before the data was read")

    monkeypatch.setattr(loading, "load_model", never)
    monkeypatch.setattr(pipeline, "load_model", never)
    data = tmp_path / "d.jsonl"
    if content is not None:
        data.write_text(content)
    b = make_bundle(tmp_path / "b", model="qwen3-8b")
    args = (["calibrate", "qwen3-8b", "--validate", "--out", str(tmp_path / "o")]
            if command == "calibrate" else ["validate", str(b.path)])
    r = CliRunner().invoke(cli, [*args, "--data", str(data)])
    assert r.exit_code == 1 and r.stderr and re.search(says, r.stderr), r.output
    assert not (tmp_path / "o").exists()


def test_overwrite_replaces_only_a_bundle(monkeypatch, tmp_path):
    """--overwrite swapped out whatever directory --out named (`--out .`, a typo'd home
    directory) for the bundle, after the calibration, and its files were gone."""
    seen = _capture_config(monkeypatch)
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "notes.txt").write_text("keep me")
    r = CliRunner().invoke(cli, ["calibrate", "qwen3-8b", "--out", str(tmp_path / "work"), "--overwrite"])
    assert r.exit_code == 2 and "is not a bundle" in r.output and not seen
    assert (tmp_path / "work" / "notes.txt").read_text() == "keep me"
    b = make_bundle(tmp_path / "b", model="qwen3-8b")   # a bundle is replaced as before
    r = CliRunner().invoke(cli, ["calibrate", "qwen3-8b", "--out", str(b.path), "--overwrite"])
    assert isinstance(r.exception, Stop), r.output


def test_the_loading_bar_ends_full(monkeypatch):
    """It was left at 0/1 once the passes began: on the terminal, loading never finished."""
    monkeypatch.setattr(loading, "load_model", lambda src: ("M", "T"))
    seen = []
    assert calibrate_cmds._load("src", lambda **e: seen.append(e)) == ("M", "T")
    assert seen[-1] == {"phase": "loading", "done": 1, "total": 1}


def test_an_out_that_cannot_be_written_is_refused_before_calibrating(monkeypatch, tmp_path):
    """The bundle is written at the end: a file in --out's path failed only after the passes."""
    seen = _capture_config(monkeypatch)
    (tmp_path / "notes.txt").write_text("a file, not a directory")
    r = CliRunner().invoke(cli, ["calibrate", "qwen3-8b", "--out", str(tmp_path / "notes.txt" / "b")])
    assert r.exit_code == 2 and "cannot write a bundle there" in r.output and not seen
    r = CliRunner().invoke(cli, ["calibrate", "qwen3-8b", "--out", str(tmp_path / "new" / "b")])
    assert isinstance(r.exception, Stop), r.output
    assert [p.name for p in (tmp_path / "new").iterdir()] == []     # no staging dir left behind


def test_validate_refuses_a_catalog_model_of_another_geometry_before_loading_it(monkeypatch,
                                                                               tmp_path):
    """`validate SMOL_BUNDLE --model qwen3-8b` downloaded and loaded the 8B model, then said
    the geometry differs."""
    def never(*a, **k):
        raise AssertionError("the model was loaded before its geometry was compared")

    monkeypatch.setattr(loading, "load_model", never)
    b = make_bundle(tmp_path / "b", model="smollm2-135m")
    r = CliRunner().invoke(cli, ["validate", str(b.path), "--model", "qwen3-8b", "--context-len", "512"])
    assert r.exit_code == 1 and "calibrated for smollm2-135m, whose geometry" in r.stderr, r.output


def _kv_shared_model_dir(tmp_path):
    """A local model whose config.json makes the test model's last 4 layers KV-shared (all
    full attention: they read layer 25's cache). No weights: the load must not come."""
    config = {"model_type": "llama", "num_hidden_layers": 30, "num_attention_heads": 9,
              "num_key_value_heads": 3, "head_dim": 64, "hidden_size": 576,
              "num_kv_shared_layers": 4}
    model = tmp_path / "my-shared-model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(config))
    return model


@pytest.mark.parametrize("where", ["a model directory", "the Hugging Face cache"])
def test_validate_refuses_kv_shared_layers_with_their_own_tensors_before_loading(monkeypatch,
                                                                                 tmp_path, where):
    """A bundle whose KV-shared layers carry other tensors than their source (calibrated
    before readers got the source's) validated well, as validation reads the source's, while an
    engine looking tensors up by layer id serves it wrong. Refused where the model's config is
    on disk before the load, the bundle left as it was; a consistent one goes on to the load."""
    import huggingface_hub

    _never_load(monkeypatch)
    model = _kv_shared_model_dir(tmp_path)
    if where == "the Hugging Face cache":     # a hub id: its config.json from the cache, if there
        hub = {("org/shared", "config.json"): str(model / "config.json")}
        monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache",
                            lambda repo, name, revision=None: hub.get((repo, name)))
        model = "org/shared"
    b = make_bundle(tmp_path / "b", model="smollm2-135m")      # every layer its own tensors
    before = _files_of(b.path)
    r = CliRunner().invoke(cli, ["validate", str(b.path), "--model", str(model)])
    assert r.exit_code == 1 and r.stdout == "", r.output
    said = " ".join(r.stderr.split())
    assert ("rotation K, rotation V on layers 26 (source 25), 27 (source 25), 28 (source 25), "
            "29 (source 25).") in said, said          # its clips are global: the same everywhere
    assert "recalibrate with this version" in said
    assert _files_of(b.path) == before

    consistent = bundle_mod.read(b.path)
    for lid in range(26, 30):
        consistent.k[lid], consistent.v[lid] = consistent.k[25], consistent.v[25]
    fixed = bundle_mod.write(consistent, tmp_path / "fixed").path
    monkeypatch.setattr(loading, "load_model", lambda src: (_ for _ in ()).throw(Stop()))
    r = CliRunner().invoke(cli, ["validate", str(fixed), "--model", str(model)])
    assert isinstance(r.exception, Stop), r.output


def test_validate_refuses_a_negative_tolerance(tmp_path):
    """A negative tolerance would fail a bundle that beats the Hadamard baseline (the job spec
    already refuses one)."""
    b = make_bundle(tmp_path / "b", model="qwen3-8b").path
    r = CliRunner().invoke(cli, ["validate", str(b), "--tolerance", "-0.1"])
    assert r.exit_code == 2 and "--tolerance" in r.output


def test_progress_off_a_terminal_is_plain_lines_not_a_redrawn_bar(monkeypatch, capsys):
    """Into a log (a job's output, CI), tqdm wrote one endless line of carriage returns per
    phase; there, a phase's start, its end and at most one line every LOG_EVERY seconds."""
    clock = iter([0.0, 1.0, 2.0, 11.5, 12.0, 12.5, 13.0])
    monkeypatch.setattr(calibrate_cmds.time, "monotonic", lambda: next(clock))
    bars = calibrate_cmds.PhaseBars()
    assert not bars.terminal    # pytest's captured stderr is no terminal
    for done in range(4):       # at 0 s (start), 1 s, 2 s (quiet), 11.5 s (10 s on)
        bars("pass1", done, 5, layer=done)
    bars("pass1", 5, 5, layer=4)                  # the end
    bars("clip_search", 0, 2, loss=0.12345)       # a new phase
    bars.close()
    err = capsys.readouterr().err
    assert "\r" not in err
    assert err.splitlines() == ["pass1: 0/5 layer=0", "pass1: 3/5 layer=3", "pass1: 5/5 layer=4",
                                "clip_search: 0/2 loss=0.123"]


# --- a full --out --------------------------------------------------------------------------------

def _calibrates_to(monkeypatch, made) -> None:
    monkeypatch.setattr(pipeline, "calibrate", lambda cfg, progress=None, loaded=None, text=None:
                        SimpleNamespace(bundle=made, tokens_per_pass=1, timings={"total": 1.0}))


@pytest.mark.parametrize("elsewhere", ["has room", "is full too"])
def test_a_calibration_meeting_a_full_out_is_saved_elsewhere_and_the_error_says_where(
        monkeypatch, tmp_path, sandbox, elsewhere):
    """The bundle is written after hours of GPU work: a full --out ended in "[Errno 28] ... (free
    space on that disk (`oscar-zoo prune` removes what no ref uses from the cache)...)", naming
    neither --out nor a fix that frees room there, and the calibration was gone. Now it is saved
    in the cache's rescued/ dir (else the temp dir), and the error says where; or, when that
    fails too, that it is lost. The disks are simulated (tests/utils/full_disk.py: a real full
    disk cannot be made in a test run in general; the test below uses one where it can)."""
    import tempfile
    from contextlib import ExitStack

    from tests.utils.full_disk import full_disk

    made = bundle_mod.read(make_bundle(tmp_path / "made", model="qwen3-8b").path)
    _calibrates_to(monkeypatch, made)
    monkeypatch.setattr(loading, "load_model", lambda src: ("M", "T"))     # for --validate
    disk, temp = tmp_path / "disk", tmp_path / "temp"
    disk.mkdir()
    temp.mkdir()
    out, rescued = disk / "qwen3-8b-bundle", sandbox / "cache" / "rescued"
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    with ExitStack() as disks:
        disks.enter_context(full_disk(monkeypatch, disk, free=1000))
        if elsewhere == "is full too":
            disks.enter_context(full_disk(monkeypatch, sandbox / "cache"))
            disks.enter_context(full_disk(monkeypatch, temp))
        r = CliRunner().invoke(cli, ["calibrate", "qwen3-8b", "--validate", "--out", str(out)])
    assert r.exit_code == 1 and r.stdout == "", r.output
    lines = [line for line in r.stderr.splitlines() if not line.startswith("loading: ")]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0].startswith(f"Error: out of disk space in --out {out} (No space left on "
                               "device) while writing the calibrated bundle; nothing "
                               "half-written was kept there"), lines[0]
    assert "prune" not in lines[0]
    assert not out.exists() and list(disk.iterdir()) == []
    if elsewhere == "has room":
        [saved] = rescued.glob("calibrate-*/qwen3-8b-bundle")
        assert (f". The calibration is not lost: it was saved to {saved} instead; move it where "
                f"it belongs (`mv {saved} DIR`)") in lines[0]
        assert f"it was not validated: run `oscar-zoo validate {saved}`" in lines[0]
        # a user who moves it later finds it again, and can drop it, by the cache's commands
        assert (f"Until then `oscar-zoo cache ls` lists it under RESCUED, and `oscar-zoo cache rm "
                f"--rescued {saved.parent.name}` removes it") in lines[0]
        assert bundle_mod.read(saved).manifest.model.name == "qwen3-8b"     # whole and verified
    else:
        assert (f"; saving it elsewhere failed too ({rescued}: No space left on device; {temp}: "
                "No space left on device), so the calibration is lost. To fix: free space on "
                "that disk, or choose another --out, and calibrate again") in lines[0]
        assert list(rescued.iterdir()) == [] and list(temp.iterdir()) == []


def test_a_validation_report_that_does_not_fit_keeps_the_calibrated_bundle_and_says_so(
        monkeypatch, tmp_path):
    """--validate writes the bundle again with its report: a disk that filled in between said
    only "[Errno 28] ...", not that the calibration was still there, nor how to get the report.
    Simulated (tests/utils/full_disk.py): the disk has room for the first write only."""
    from tests.utils.full_disk import full_disk

    made_dir = make_bundle(tmp_path / "made", model="qwen3-8b").path
    _calibrates_to(monkeypatch, bundle_mod.read(made_dir))
    monkeypatch.setattr(loading, "load_model", lambda src: ("M", "T"))
    monkeypatch.setattr(calibrate_cmds, "_validate_in_place", lambda bundle, loaded, bars: bundle)
    first = sum(p.stat().st_size for p in made_dir.iterdir())   # what the first write writes
    disk = tmp_path / "disk"
    disk.mkdir()
    out = disk / "b"
    with full_disk(monkeypatch, disk, free=first) as full:
        r = CliRunner().invoke(cli, ["calibrate", "qwen3-8b", "--validate", "--out", str(out)])
    assert full.refused and r.exit_code == 1, r.output
    assert r.stderr.strip().splitlines()[-1] == (
        f"Error: out of disk space in --out {out} (No space left on device) while storing the "
        "validation report in the bundle; the calibrated bundle there is kept as it was, without "
        f"the report. To fix: free space on that disk, then run `oscar-zoo validate {out}`")
    assert bundle_mod.read(out).manifest.model.name == "qwen3-8b"


def test_a_calibration_meeting_a_real_full_out_is_saved_on_another_disk(tmp_path, sandbox):
    """As above on a real filesystem: --out on a 64 KB tmpfs, in a user namespace of its own
    (skipped where the kernel or the container refuses one), the cache on the test's disk. The
    calibration itself is replaced (in the child process, which has the tmpfs)."""
    from tests.utils.full_disk import run_on_a_tiny_tmpfs

    made = make_bundle(tmp_path / "made", model="qwen3-8b").path       # 4.7 MB of rotations
    disk = tmp_path / "disk"
    script = tmp_path / "calibrate.py"
    script.write_text(
        "import sys\n"
        "from types import SimpleNamespace\n"
        "import oscar_zoo.calibrate.pipeline as pipeline\n"
        "from oscar_zoo.zoo import bundle\n"
        f"made = bundle.read({str(made)!r})\n"
        "pipeline.calibrate = lambda cfg, progress=None, loaded=None, text=None: SimpleNamespace("
        "bundle=made, tokens_per_pass=1, timings={'total': 1.0})\n"
        "from oscar_zoo.zoo.cli.main import main\n"
        f"sys.argv = ['oscar-zoo', 'calibrate', 'qwen3-8b', '--out', {str(disk / 'b')!r}]\n"
        "main()\n")
    proc = run_on_a_tiny_tmpfs(disk, f'"{sys.executable}" "{script}"', os.environ.copy(), 300)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    [saved] = (sandbox / "cache" / "rescued").glob("calibrate-*/b")
    assert (f"Error: out of disk space in --out {disk / 'b'} (No space left on device) while "
            "writing the calibrated bundle; nothing half-written was kept there. The calibration "
            f"is not lost: it was saved to {saved} instead") in proc.stderr.strip().splitlines()[-1]
    assert bundle_mod.read(saved).manifest.model.name == "qwen3-8b"


def _never_load(monkeypatch):
    def never(*a, **k):
        raise AssertionError("the model was loaded before the settings were checked")

    monkeypatch.setattr(loading, "load_model", never)
    monkeypatch.setattr(pipeline, "load_model", never)


def test_calibrate_suggests_the_catalog_name_a_typo_is_close_to(monkeypatch, tmp_path):
    """`show`, `pull` and `convert` said "Did you mean: smollm2-135m?"; calibrate did not."""
    _never_load(monkeypatch)
    r = CliRunner().invoke(cli, ["calibrate", "smollm-135m", "--out", str(tmp_path / "b")])
    assert r.exit_code == 1 and "Did you mean: smollm2-135m?" in r.stderr, r.output
    assert "'smollm-135m' is not a catalog model" in r.stderr
    b = make_bundle(tmp_path / "made", model="qwen3-8b")   # validate --model too
    r = CliRunner().invoke(cli, ["validate", str(b.path), "--model", "qwen3-8bb"])
    assert r.exit_code == 1 and "Did you mean: qwen3-8b" in r.stderr, r.output
    r = CliRunner().invoke(cli, ["calibrate", "./smollm2-135m", "--out", str(tmp_path / "b")])
    assert r.exit_code == 1 and "no such file or directory" in r.stderr    # a path: no guess
    assert "Did you mean" not in r.stderr


@pytest.mark.parametrize("validating", [[], ["--validate"]])
def test_a_seq_len_too_short_for_the_clip_search_names_options_that_exist(monkeypatch, tmp_path,
                                                                          validating):
    """The error said "or lower the windows": the sink and recent windows are how OSCAR serves
    the model, and calibrate has no option for them. --no-clip-search is the way out it has."""
    _never_load(monkeypatch)
    r = CliRunner().invoke(cli, ["calibrate", "smollm2-135m", "--seq-len", "256", *validating,
                                 "--out", str(tmp_path / "b")])
    assert r.exit_code == 1, r.output
    assert ("--seq-len 256 leaves no INT2 keys for the clip search: its windows must be longer "
            "than the BF16 sink 64 + recent 256 = 320 tokens (how OSCAR serves smollm2-135m). "
            "Raise --seq-len above 320 (e.g. 2048), or pass --no-clip-search to keep OSCAR's "
            "shipped clips (K 0.96 / V 0.92)") in " ".join(r.stderr.split()), r.stderr
    assert "lower the windows" not in r.stderr and "job spec" not in r.stderr
    seen = _capture_config(monkeypatch)      # and the way out it names works
    r = CliRunner().invoke(cli, ["calibrate", "smollm2-135m", "--seq-len", "256",
                                 "--no-clip-search", "--out", str(tmp_path / "b")])
    assert isinstance(r.exception, Stop), r.output
    assert seen[0].seq_len == 256 and not seen[0].clip_search


def test_a_seq_len_too_short_for_a_model_outside_the_catalog_says_whose_windows(monkeypatch,
                                                                                tmp_path):
    """It said "(the defaults)": of what, the user could not tell. The check is the job spec's
    (jobspec.check_clip_windows), in calibrate's options."""
    _never_load(monkeypatch)
    r = CliRunner().invoke(cli, ["calibrate", "someorg/some-model", "--seq-len", "256",
                                 "--out", str(tmp_path / "b")])
    assert r.exit_code == 1, r.output
    said = " ".join(r.stderr.split())
    assert ("= 320 tokens (OSCAR's defaults for a model outside its catalog). Raise --seq-len "
            "above 320") in said, said
    assert "clip_search false" not in said and "job spec" not in said


class _WordTokenizer:
    """One token per word: what token_windows asks of a tokenizer."""
    add_bos_token = False
    bos_token_id = None

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": list(range(len(text.split())))}


@pytest.mark.parametrize("clip, says", [
    ([], "3 needed for 1,536 tokens: --tokens 512 to calibrate on, plus 2 windows of --seq-len "
         "512 held out for the clip search (--no-clip-search needs none)"),
    (["--no-clip-search"], None)])
def test_too_little_text_says_the_clip_search_takes_windows_too(monkeypatch, tmp_path, clip, says):
    """--tokens 512 --seq-len 512 said "3 needed for 1,536 tokens" with no word of where the
    other 1,024 came from: the clip search's held-out windows."""
    class Calibrated(Exception):
        pass

    monkeypatch.setattr(pipeline, "load_model", lambda src: (object(), _WordTokenizer()))
    monkeypatch.setattr(pipeline.capture, "install", lambda model: None)
    monkeypatch.setattr(pipeline, "model_geometry", lambda model: src_geometry)
    monkeypatch.setattr(pipeline, "_moments_and_fit", lambda *a: (_ for _ in ()).throw(Calibrated()))
    from oscar_zoo.zoo.catalog import lookup

    src_geometry = lookup("smollm2-135m").geometry
    data = tmp_path / "d.txt"
    data.write_text("word " * 1000)                 # room for one window of 512
    r = CliRunner().invoke(cli, ["calibrate", "smollm2-135m", "--tokens", "512", "--seq-len", "512",
                                 *clip, "--data", str(data), "--out", str(tmp_path / "b")])
    if says is None:                                # one window is all it needs
        assert isinstance(r.exception, Calibrated), r.output
        return
    assert r.exit_code == 1 and says in r.stderr, r.output
    assert "room for 1 windows of 512" in r.stderr and "add data" in r.stderr


# --- bundles in the cache ------------------------------------------------------------------------

def _cached_snapshot(tmp_path):
    """A bundle where `pull` leaves one: <cache>/models/<name>/snapshots/<digest> (the sandbox's
    cache). Its files' (inode, bytes), to tell that nothing rewrote them."""
    from oscar_zoo.zoo.cache import Cache
    from oscar_zoo.zoo.files import sha256_file

    made = make_bundle(tmp_path / "made", model="smollm2-135m").path
    snap = Cache().snapshot_dir("smollm2-135m", sha256_file(made / "bundle.json"))
    snap.parent.mkdir(parents=True)
    made.rename(snap)
    return snap, _files_of(snap)


def _files_of(d) -> dict:
    return {p.name: (p.stat().st_ino, p.read_bytes()) for p in sorted(d.iterdir())}


def _validates_to(monkeypatch, passed=True) -> list:
    """Validation replaced by a real report (the manifest takes it), its calls recorded."""
    from oscar_zoo.zoo.manifest import Validation, VariantResult

    calls = []
    report = Validation(
        passed=passed, criterion="extra loss <= Hadamard's + 0.05 nats", tolerance=0.05,
        dataset="builtin:pydoc", context_len=384, eval_windows=1, eval_tokens=384, sink_tokens=64,
        recent_tokens=256, group_size=64, scale_dtype="float32", bf16_nll=2.0, bits_int2_tier=3.0,
        bits_at_context=7.0, created_at="2025-01-01T00:00:00Z", code_version="test",
        variants=[VariantResult(name="bundle", delta_nll=0.1, kl=0.01, attn_rel_error=0.2,
                                delta_nll_by_set=[0.1])])
    monkeypatch.setattr(loading, "load_model", lambda src: ("M", "T"))
    monkeypatch.setattr(calibrate_cmds, "_quantizer", lambda bundle, model: None)
    monkeypatch.setattr(validate_mod, "validate",
                        lambda *a, **k: calls.append(a[0].path) or report)
    return calls


@pytest.mark.parametrize("reached", ["as pull prints it", "by a link to it",
                                     "through a linked parent dir"])
def test_validate_refuses_to_write_into_the_cache_before_loading(monkeypatch, tmp_path, reached):
    """`validate <the snapshot path pull printed>` stored its report there: the snapshot's
    bundle.json no longer hashed to its digest, and the next `oscar-zoo verify` deleted the
    whole version, report and all. Refused now before any work (validation takes minutes),
    however the path reaches the cache."""
    _never_load(monkeypatch)
    snap, before = _cached_snapshot(tmp_path)
    given = {"as pull prints it": snap, "by a link to it": tmp_path / "link",
             "through a linked parent dir": tmp_path / "snaps" / snap.name}[reached]
    if reached == "by a link to it":
        given.symlink_to(snap)
    elif reached != "as pull prints it":
        given.parent.symlink_to(snap.parent)
    r = CliRunner().invoke(cli, ["validate", str(given), "--windows", "1", "--context-len", "384"])
    assert r.exit_code == 1 and r.stdout == "", r.output
    said = " ".join(r.stderr.split())
    assert said.startswith(f"Error: {given} is a bundle in the oscar-zoo cache"), said
    assert "oscar-zoo verify" in said and "--no-write" in said
    assert f"`oscar-zoo export {given} --format safetensors --out DIR`" in said
    assert _files_of(snap) == before


def test_validate_no_write_of_a_cached_bundle_prints_the_report_and_leaves_the_cache(monkeypatch,
                                                                                     tmp_path):
    snap, before = _cached_snapshot(tmp_path)
    calls = _validates_to(monkeypatch)
    r = CliRunner().invoke(cli, ["validate", str(snap), "--no-write", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["passed"] is True and calls == [snap]
    assert "report stored" not in r.stderr
    assert _files_of(snap) == before


def test_the_copy_the_refusal_names_validates_and_keeps_its_report(monkeypatch, tmp_path):
    """The way out the error names, run as it is written: export, then validate the copy."""
    import shlex

    _never_load(monkeypatch)
    snap, before = _cached_snapshot(tmp_path)
    r = CliRunner().invoke(cli, ["validate", str(snap)])
    command = re.search(r"`oscar-zoo (export [^`]+)`", " ".join(r.stderr.split())).group(1)
    copy = tmp_path / "my copy"
    argv = [str(copy) if a == "DIR" else a for a in shlex.split(command)]
    r = CliRunner().invoke(cli, argv)
    assert r.exit_code == 0, r.output
    _validates_to(monkeypatch)
    r = CliRunner().invoke(cli, ["validate", str(copy)])
    assert r.exit_code == 0, r.output
    assert bundle_mod.read(copy).manifest.validation.passed
    assert _files_of(snap) == before


def test_validate_takes_a_bundle_calibrate_rescued_into_the_cache(monkeypatch, tmp_path, sandbox):
    """rescued/ is the user's own bundle, not a snapshot: the rescue's error says to run
    `oscar-zoo validate` on it, and that must go on working."""
    from oscar_zoo.zoo.cache import Cache

    saved = Cache().rescued / "calibrate-20250101-000000Z-abc" / "b"
    saved.parent.mkdir(parents=True)
    make_bundle(saved, model="smollm2-135m")
    _validates_to(monkeypatch)
    r = CliRunner().invoke(cli, ["validate", str(saved)])
    assert r.exit_code == 0, r.output
    assert bundle_mod.read(saved).manifest.validation.passed


@pytest.mark.parametrize("where", ["snapshot", "new dir"])
def test_calibrate_refuses_an_out_in_the_cache_before_calibrating(monkeypatch, tmp_path, where):
    """--out <a snapshot> --overwrite swapped the pulled version out for the new calibration
    (which verify then deleted); a new dir in the cache is one its commands do not own."""
    from oscar_zoo.zoo.cache import Cache

    seen = _capture_config(monkeypatch)
    snap, before = _cached_snapshot(tmp_path)
    out = snap if where == "snapshot" else Cache().root / "mine"
    r = CliRunner().invoke(cli, ["calibrate", "smollm2-135m", "--out", str(out), "--overwrite"])
    assert r.exit_code == 1 and not seen, r.output
    assert f"--out {out} is in the oscar-zoo cache" in " ".join(r.stderr.split())
    assert _files_of(snap) == before and not (Cache().root / "mine").exists()


# --- what the tables say -------------------------------------------------------------------------

def test_one_evaluation_set_prints_a_dash_not_nan():
    """--windows 1 measures one set: set B printed +nan in every row."""
    one = {"name": "bundle", "delta_nll": 0.1, "kl": 0.01, "attn_rel_error": 0.2,
           "delta_nll_by_set": [0.1]}
    two = {**one, "name": "hadamard", "delta_nll_by_set": [0.1, 0.12]}
    text = calibrate_cmds._human_report(_report(variants=[one, two]))
    assert "nan" not in text.lower()
    rows = {line.split()[0]: line.split() for line in text.splitlines()[5:7]}
    assert rows["bundle"][2:4] == ["+0.1000", "-"] and rows["hadamard"][2:4] == ["+0.1000", "+0.1200"]


def _summary(searched: bool) -> dict:
    return {"path": "b", "model": "m", "hub_id": "o/m", "layers": 2, "kv_heads": 1, "head_dim": 64,
            "method": "x", "key_centering": True, "timings_s": {"total": 1.0},
            "clip": {"k": 0.96, "v": 0.92, "granularity": "layer", "searched": searched}}


def test_the_summary_calls_unsearched_clips_the_fixed_default_not_a_best_pair():
    """After --no-clip-search it said "best single pair (fixed)": nothing had been searched."""
    line = next(s for s in calibrate_cmds._human(_summary(False)).splitlines() if s.startswith("clip"))
    assert "best" not in line and "searched" not in line.replace("no clip search", "")
    assert "K 0.96 / V 0.92" in line and "fixed default" in line and "--no-clip-search" in line
    line = next(s for s in calibrate_cmds._human(_summary(True)).splitlines() if s.startswith("clip"))
    assert "best single pair (searched per layer)" in line


# --- a budget that is not whole windows ----------------------------------------------------------

@pytest.mark.parametrize("args, says", [
    (["--tokens", "10", "--seq-len", "400"],
     "a budget of 10 tokens (--tokens) is rounded up to 1 whole window of 400 tokens (--seq-len): "
     "calibrating on 400 tokens, 390 more. For fewer, pass a shorter --seq-len"),
    (["--tokens", "1000", "--seq-len", "400"],
     "a budget of 1,000 tokens (--tokens) is rounded up to 3 whole windows of 400 tokens "
     "(--seq-len): calibrating on 1,200 tokens, 200 more. For a whole number of windows, pass "
     "--tokens 800 or 1200, or another --seq-len"),
    (["--tokens", "800", "--seq-len", "400"], None),    # whole windows
    ([], None)])                                        # OSCAR's recipe as shipped: no news
def test_a_budget_rounded_up_to_whole_windows_is_said_before_calibrating(monkeypatch, tmp_path,
                                                                         args, says):
    """--tokens 10 --seq-len 400 calibrated on 400 tokens without a word, and the manifest's
    calibration.tokens (400) disagreed with the budget asked (10)."""
    seen = _capture_config(monkeypatch)
    r = CliRunner().invoke(cli, ["calibrate", "smollm2-135m", *args, "--out", str(tmp_path / "b")])
    assert isinstance(r.exception, Stop) and seen, r.output
    said = " ".join(r.stderr.split())
    if says is None:
        assert "rounded up" not in said, said
    else:
        assert f"warning: {says}" in said, said
