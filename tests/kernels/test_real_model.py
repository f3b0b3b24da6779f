"""The kernels on real post-RoPE K/V/Q of the test model (SmolLM2-135M, first 2 layers)."""

from __future__ import annotations

import pydoc_data.topics as topics
import pytest
import torch

from oscar_zoo.kernels import Int2KVCache, decode_attention, quantize_kv
from oscar_zoo.kernels import reference as ref

from .conftest import random_orthogonal, run_poisoned, same_bits, signed_permutation

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def real_qkv(smollm2):
    """{layer: (q [T, 9, 64], k [T, 3, 64], v [T, 3, 64])} for 512 tokens of reference prose."""
    from oscar_zoo.calibrate import capture

    model, tok = smollm2
    text = "\n\n".join(topics.topics[k] for k in sorted(topics.topics))[:20000]
    ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"][:512]])
    seen = {}
    full = model.model.layers
    model.model.layers = torch.nn.ModuleList(list(full)[:2])     # the first 2 layers are exact
    try:
        with capture.observing(lambda m, q, k, v, mask, kw: seen.setdefault(m.layer_idx, (q, k, v))), \
                torch.no_grad():
            model.model(ids.to(model.device))
    finally:
        model.model.layers = full
    # on the CPU: the tests move them to the device under test
    return {i: tuple(x[0].transpose(0, 1).float().cpu().contiguous() for x in seen[i]) for i in (0, 1)}


def test_quantize_bit_exact_on_real_kv(real_qkv, device):
    gen = torch.Generator().manual_seed(10)
    for layer, (_, k, v) in real_qkv.items():
        h, d = k.shape[1], k.shape[2]
        clip = torch.tensor([0.96, 0.92, 0.9])
        for x, mean in ((k, k.mean(0)), (v, None)):
            # a general rotation, applied outside: the kernel quantizes the given rows bit-exactly
            xr = ref.ref_rotate(x, random_orthogonal(h, d, d, gen=gen)).float()
            packed, sz = run_poisoned(lambda: quantize_kv(xr.to(device), None, clip, 32, torch.float16))
            rp, rsz = ref.ref_quantize_rotated(xr, clip, 32, torch.float16)
            assert torch.equal(packed.cpu(), rp) and same_bits(sz.cpu(), rsz), layer
            # fused rotation + centering, exact rotation
            r = signed_permutation(d, gen)
            args = (x.to(device), r.to(device), clip, None, torch.float32)
            packed, sz = quantize_kv(*args, mean=None if mean is None else mean.to(device))
            rp, rsz = ref.ref_quantize_kv(x, r, clip, None, torch.float32, mean=mean)
            assert torch.equal(packed.cpu(), rp) and same_bits(sz.cpu(), rsz), layer


def test_decode_on_real_qkv(real_qkv, device):
    gen = torch.Generator().manual_seed(11)
    for layer, (q, k, v) in real_qkv.items():
        h, d = k.shape[1], k.shape[2]
        lens = [300, 512]                               # two prefixes: decode steps at 299 and 511
        keys, values = [k[:n] for n in lens], [v[:n] for n in lens]
        qd = torch.stack([q[n - 1] for n in lens])       # [2, 9, 64]
        rk, rv = random_orthogonal(h, d, d, gen=gen), random_orthogonal(h, d, d, gen=gen)
        cache = Int2KVCache.from_dense([x.to(device) for x in keys], [x.to(device) for x in values], rk.to(device),
                                       rv.to(device), torch.tensor([0.96, 0.92, 0.96]), 0.96, None, torch.float16,
                                       sink=16, recent=64, page_size=64, mean=k.mean(0).to(device))
        out = run_poisoned(lambda: decode_attention(qd.to(device), cache, sm_scale=d ** -0.5)).cpu()
        cpu = Int2KVCache(**{f: (x.cpu() if isinstance(x, torch.Tensor) else x) for f, x in vars(cache).items()})
        want = ref.ref_decode_attention(qd, cpu, sm_scale=d ** -0.5)
        assert ((out.double() - want).norm(dim=-1) / want.norm(dim=-1)).max() < 2e-2, layer
        exact = ref.ref_attention(qd, keys, values, d ** -0.5)
        assert (out.double() - exact).norm() / exact.norm() < 0.3, layer   # INT2 with windows: close
