"""`convert --from sglang` on a file that is no torch checkpoint says what the file is and how to
get a right one: it said "k.pt is not a readable torch checkpoint: 105" (105: the byte 'i' that
a text file began with, as torch's unpickler reports it)."""

from __future__ import annotations

import io
import struct

import pytest
from click.testing import CliRunner

from oscar_zoo.zoo.cli.main import cli
from oscar_zoo.zoo.errors import BundleFormatError
from oscar_zoo.zoo.interop import oscar_pt

torch = pytest.importorskip("torch")

GET_ONE = "`oscar-zoo pull MODEL --format sglang --out DIR`"


def _safetensors_head() -> bytes:
    header = b'{"k.0.rotation":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'
    return struct.pack("<Q", len(header)) + header + b"\0" * 4


@pytest.mark.parametrize("content, is_, fix", [
    (b"import torch\nR = torch.eye(128)\n", "a text file", GET_ONE),
    (b"hello", "a text file", GET_ONE),           # torch: KeyError('101')
    (b"", "an empty file", GET_ONE),
    (b"version https://git-lfs.github.com/spec/v1\noid sha256:ab\nsize 12\n",
     "a Git LFS pointer to it", "run `git lfs pull` in that checkout"),
    (b"<!DOCTYPE html><html>Sign in</html>", "an HTML or XML page", GET_ONE),
    (b'{"format": "oscar-zoo.bundle"}', "JSON", GET_ONE),
    (_safetensors_head(), "a safetensors file", "oscar-zoo convert --to sglang BUNDLE_DIR"),
    (bytes(range(200, 256)) * 4, "binary data starting c8 c9 ca", GET_ONE),
])
def test_a_file_that_is_no_checkpoint_is_named_for_what_it_is(tmp_path, content, is_, fix):
    path = tmp_path / "k.pt"
    path.write_bytes(content)
    with pytest.raises(BundleFormatError) as e:
        oscar_pt.read_file(path)
    said = str(e.value)
    assert said.startswith(f"k.pt is not a torch checkpoint (a ZIP archive, as torch.save "
                           f"writes) but {is_}"), said
    assert fix in said


def test_the_cli_says_it_in_one_line(tmp_path):
    (tmp_path / "k.pt").write_text("import torch\n")
    buf = io.BytesIO()
    torch.save({"format_version": 1, "layers": {0: {"rotation": torch.eye(4)}}}, buf)
    (tmp_path / "v.pt").write_bytes(buf.getvalue())
    r = CliRunner().invoke(cli, ["convert", "--from", "sglang", str(tmp_path / "k.pt"),
                                 str(tmp_path / "v.pt"), "--model", "qwen3-8b",
                                 "--out", str(tmp_path / "b")])
    assert r.exit_code == 1, r.output
    assert r.stderr.startswith("Error: k.pt is not a torch checkpoint (a ZIP archive, as "
                               "torch.save writes) but a text file: pass the k_rotation_*.pt")
    assert "105" not in r.stderr and r.stderr.count("\n") == 1


def test_a_damaged_checkpoint_gives_a_reason_not_a_raw_value(tmp_path):
    buf = io.BytesIO()
    torch.save({"format_version": 1, "layers": {0: {"rotation": torch.eye(4)}}}, buf)
    path = tmp_path / "k.pt"
    path.write_bytes(buf.getvalue()[:200])              # cut short: a ZIP header, then nothing
    with pytest.raises(BundleFormatError, match=r"k\.pt is not a readable torch checkpoint "
                                                r"\(.+\); it looks cut short or damaged: pass"):
        oscar_pt.read_file(path)
    assert oscar_pt._why(KeyError(105)) == "KeyError"           # no bare byte value for a reason
    assert oscar_pt._why(KeyError("101")) == "KeyError"
