"""Bad input to calibration and validation is refused with a domain error that says what to
use, before a model is loaded or run, instead of a raw traceback after the expensive work.

No test here loads the real model or touches the network: models are stand-ins whose config is
all the checks read, and the hub is either offline or a raised huggingface_hub error.
"""

from __future__ import annotations

import socket
from types import SimpleNamespace

import pytest

from oscar_zoo.calibrate import clip_search, jobspec, loading, pipeline
from oscar_zoo.calibrate.pipeline import CalibrationConfig, calibrate
from oscar_zoo.calibrate.validate import ValidationConfig, validate
from oscar_zoo.zoo import catalog
from oscar_zoo.zoo.bundle import Bundle
from oscar_zoo.zoo.errors import InvalidInput, ModelNotFound, OfflineError
from tests.utils.bundles import make_manifest, make_tensors


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Any DNS lookup fails the test (the pattern of tests/zoo/conftest.py, loopback aside)."""
    attempts: list[str] = []

    def refuse(host, *args, **kwargs):
        attempts.append(str(host))
        raise socket.gaierror(socket.EAI_NONAME, f"test socket guard: lookup of {host} refused")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    yield
    assert not attempts, f"network access attempted: {attempts}"


def _never(*args, **kwargs):
    raise AssertionError("a model was loaded or run for input that should have been refused")


# --- calibration: windows without INT2 tokens ---------------------------------------------------

def test_query_rows_without_int2_tokens_is_invalid_input():
    with pytest.raises(InvalidInput, match="seq-len > 320"):
        clip_search.query_rows(256, 64, 256, 64, 0)


@pytest.mark.parametrize("kw, match", [
    (dict(seq_len=256), "seq_len 256 .* above 320"),
    (dict(seq_len=320), "seq_len 320 .* above 320"),
    (dict(clip_windows=0), "clip_windows >= 1"),
    (dict(clip_queries=0), "clip_queries >= 1"),
    (dict(sink_tokens=-1), "must be >= 0"),
    (dict(seed=2**64), "seed 18446744073709551616: use a number from 0"),   # was: after both passes
    (dict(seed=-1), "seed -1"),
])
def test_calibration_refuses_before_loading_anything(monkeypatch, kw, match):
    monkeypatch.setattr(pipeline, "resolve_source", _never)
    monkeypatch.setattr(pipeline, "load_model", _never)
    with pytest.raises(InvalidInput, match=match):
        calibrate(CalibrationConfig(model="smollm2-135m", tokens=512, **kw))


@pytest.mark.parametrize("kw", [dict(seq_len=256, clip_search=False),
                                dict(seq_len=256, sink_tokens=0, recent_tokens=0),
                                dict(seq_len=321), dict(clip_windows=0, clip_search=False)])
def test_calibration_accepts_windows_it_can_use(kw):
    CalibrationConfig(model="smollm2-135m", **kw).check()


def test_a_job_spec_with_windows_too_short_for_the_clip_search_is_told_in_its_fields():
    """It said "raise --seq-len (seq_len in a job spec) above 320 or lower the windows": a CLI
    option, and windows no field is called. It is `oscar-zoo calibrate`'s check, worded in the
    spec's fields: what is short, the numbers, where the windows come from, the ways out."""
    spec = jobspec.parse_spec({"model": "smollm2-135m", "seq_len": 256})
    spec = jobspec.complete(spec, catalog.find("smollm2-135m"))
    with pytest.raises(InvalidInput) as e:
        jobspec.check(spec, None)
    assert str(e.value) == (
        "seq_len 256 leaves no INT2 keys for the clip search: its windows must be longer than "
        "the BF16 sink 64 + recent 256 = 320 tokens (the job spec's sink_tokens and "
        "recent_tokens; by default how OSCAR serves the model). Raise seq_len above 320 (e.g. "
        "2048), or set clip_search false to use the fixed k_clip / v_clip instead (OSCAR ships "
        "0.96 / 0.92)")
    jobspec.check(spec.model_copy(update={"clip_search": False}), None)   # the way out works


def test_windows_longer_than_the_default_seq_len_get_no_example_that_is_too_short():
    with pytest.raises(InvalidInput, match=r"Raise seq_len above 3072, or set clip_search false"):
        jobspec.check_clip_windows(2048, 1024, 2048)
    jobspec.check_clip_windows(3073, 1024, 2048)


# --- validation: settings and a bundle that do not fit --------------------------------------------

def _bundle(model: str = "smollm2-135m") -> Bundle:      # 30 layers, 9/3 heads, head_dim 64
    manifest = make_manifest(model)
    return Bundle(manifest, *make_tensors(manifest))


def _model(layers=30, q_heads=9, kv_heads=3, head_dim=64):
    """What validate's checks read of a model: its config (it cannot run a forward)."""
    config = {"num_hidden_layers": layers, "num_attention_heads": q_heads,
              "num_key_value_heads": kv_heads, "head_dim": head_dim, "hidden_size": 576}
    return SimpleNamespace(config=config)


@pytest.mark.parametrize("kw, match", [
    (dict(context_len=256, windows=2), r"context_len 256 must exceed sink 64 \+ recent 256 = 320"),
    (dict(context_len=320, windows=2), "context_len 320 must exceed"),
    (dict(windows=0), "at least 1 window"),
    (dict(windows=-3), "at least 1 window"),
    # the whole run, then the manifest refused the non-finite number at its end
    (dict(tolerance=float("nan")), "must be finite"),
    (dict(naive_fraction=float("inf")), "must be finite"),
])
def test_validation_refuses_settings_that_measure_nothing(kw, match):
    with pytest.raises(InvalidInput, match=match):
        validate(_bundle(), _model(), _never, ValidationConfig(**kw), quantizer=None)


@pytest.mark.parametrize("model, match", [
    (_model(layers=4), "num_layers 30 in the bundle, 4 in the model"),
    (_model(kv_heads=1), "num_kv_heads 3 in the bundle, 1 in the model"),
    (_model(head_dim=128), "head_dim 64 in the bundle, 128 in the model"),
])
def test_validation_names_a_geometry_the_bundle_was_not_made_for(model, match):
    with pytest.raises(InvalidInput, match=match) as e:
        validate(_bundle(), model, _never, ValidationConfig(context_len=512, windows=2), quantizer=None)
    assert "smollm2-135m" in str(e.value)


def test_validation_names_different_attention_layers():
    model = _model()
    model.config["layer_types"] = ["linear_attention" if i % 2 else "full_attention" for i in range(30)]
    with pytest.raises(InvalidInput, match="attention layers"):
        validate(_bundle(), model, _never, ValidationConfig(context_len=512, windows=2), quantizer=None)


def test_validation_of_a_matching_model_goes_on_to_the_text(monkeypatch):
    # The checks pass: validation reaches its held-out windows (stopped there on purpose).
    from oscar_zoo.calibrate import validate as validate_mod

    def stop(*args, **kwargs):
        raise RuntimeError("reached eval_windows")

    monkeypatch.setattr(validate_mod, "eval_windows", stop)
    with pytest.raises(RuntimeError, match="reached eval_windows"):
        validate(_bundle(), _model(), None, ValidationConfig(context_len=512, windows=2), quantizer=None)


# --- model sources: paths that do not exist, hub ids, hub errors -----------------------------------

@pytest.mark.parametrize("name", ["./typo-dir", "../typo-dir", "/x/missing.gguf", "~/no/such/dir",
                                  "missing.gguf"])
def test_a_missing_path_is_model_not_found(name):
    with pytest.raises(ModelNotFound, match=f"no such file or directory: {name}"):
        loading.resolve_source(name)


def test_an_existing_file_that_is_no_model_is_model_not_found(tmp_path):
    f = tmp_path / "weights.bin"
    f.write_bytes(b"x")
    with pytest.raises(ModelNotFound, match="neither a model directory nor a .gguf file"):
        loading.resolve_source(str(f))


def test_a_directory_without_config_json_is_model_not_found(tmp_path):
    """transformers raised its own OSError for it, deep inside the load."""
    (tmp_path / "model.safetensors").write_bytes(b"x")
    with pytest.raises(ModelNotFound, match="has no config.json"):
        loading.resolve_source(str(tmp_path))
    (tmp_path / "config.json").write_text("{}")
    assert loading.resolve_source(str(tmp_path)).path == str(tmp_path)


@pytest.mark.parametrize("name", ["a/b/c", "org/na me", "-org/name", "org/"])
def test_only_a_hub_id_spelling_is_taken_as_a_hub_id(name):
    with pytest.raises(ModelNotFound, match="is not a catalog model"):
        loading.resolve_source(name)


def test_a_hub_id_is_resolved_without_the_network():
    src = loading.resolve_source("HuggingFaceTB/SmolLM2-360M", "main")
    assert (src.path, src.gguf_file, src.revision) == ("HuggingFaceTB/SmolLM2-360M", None, "main")


def test_an_uncached_hub_model_offline_is_offline_error(monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(OfflineError, match="nobody-xyz/no-such-model is not in the local hub cache"):
        loading.load_model(loading.resolve_source("nobody-xyz/no-such-model"))


def _hub_failure(cause: Exception):
    def from_pretrained(*args, **kwargs):   # how transformers reports hub errors: OSError from e
        raise OSError("transformers' multi-line message") from cause
    return from_pretrained


def _unresolved(monkeypatch) -> None:
    """The revision left as asked, as transformers' resolve_revision leaves it when the hub
    does not answer (load_model resolves it before the load these tests make fail)."""
    import transformers.utils.hub

    monkeypatch.setattr(transformers.utils.hub, "resolve_revision",
                        lambda path, revision=None, **kwargs: revision)


@pytest.mark.parametrize("cause, error, match", [
    ("RepositoryNotFoundError", ModelNotFound, "org/gone at revision v9 was not found on the hub"),
    ("RevisionNotFoundError", ModelNotFound, "org/gone at revision v9 was not found"),
    ("LocalEntryNotFoundError", OfflineError, "org/gone at revision v9 is not in the local hub cache"),
])
def test_hub_errors_become_domain_errors(monkeypatch, cause, error, match):
    import transformers
    from huggingface_hub import errors as hub

    cls = getattr(hub, cause)
    exc = cls.__new__(cls)   # its __init__ wants an HTTP response whose type varies by version
    exc.args = ("hub said no",)
    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", _hub_failure(exc))
    _unresolved(monkeypatch)
    with pytest.raises(error, match=match):
        loading.load_model(loading.resolve_source("org/gone", "v9"))


def test_other_os_errors_pass_through(monkeypatch):
    # A disk or permission fault may pass on another attempt: it stays an OSError.
    import transformers

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained",
                        _hub_failure(PermissionError(13, "Permission denied")))
    _unresolved(monkeypatch)
    with pytest.raises(OSError) as e:
        loading.load_model(loading.resolve_source("org/gone"))
    assert not isinstance(e.value, (ModelNotFound, OfflineError))


@pytest.mark.parametrize("group, match", [(48, "power of two dividing head_dim"),
                                          (8, "below head_dim/4 = 16")])
def test_the_calibrate_command_refuses_a_group_size_before_loading(monkeypatch, group, match):
    """It used to load the model and run both passes (48), or write a bundle the decode
    kernel refuses (8): the checks a job gets at submit now run first."""
    from click.testing import CliRunner

    from oscar_zoo.zoo.cli.main import cli

    monkeypatch.setattr(loading, "load_model", _never)
    monkeypatch.setattr(pipeline, "load_model", _never)
    r = CliRunner().invoke(cli, ["calibrate", "smollm2-135m", "--group-size", str(group),
                                 "--out", "never-written"])
    assert r.exit_code != 0 and "Traceback" not in r.output
    assert match in r.output, r.output


@pytest.mark.parametrize("head_dim", [96, 32])
def test_a_head_dim_the_kernels_cannot_take_is_refused_before_the_passes(monkeypatch, head_dim):
    """head_dim 96 failed after both passes with a bare ValueError from the Hadamard step, 32
    at the clip search's first kernel."""
    import transformers

    config = transformers.LlamaConfig(vocab_size=64, hidden_size=4 * head_dim, intermediate_size=64,
                                      num_hidden_layers=1, num_attention_heads=4,
                                      num_key_value_heads=2, head_dim=head_dim)
    model = transformers.LlamaForCausalLM(config)
    monkeypatch.setattr(pipeline, "_pass", _never)
    monkeypatch.setattr(pipeline, "load_text", _never)
    with pytest.raises(InvalidInput, match=f"head_dim {head_dim}: .* power of two >= 64"):
        calibrate(CalibrationConfig(model="smollm2-135m", tokens=512), loaded=(model, None))
