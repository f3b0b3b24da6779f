"""quantize_kv against the float64 reference: bit-exact packing and scales where the rotation is
exact in float32, the spec's clip semantics (ties included), per-head clip, centering, and close
agreement with a general rotation."""

from __future__ import annotations

import pytest
import torch
import triton.language as tl

from oscar_zoo.kernels import dequantize_kv, fake_quantize_kv, prepare_rotation, quantize_kv
from oscar_zoo.kernels import quantize as quantize_mod
from oscar_zoo.kernels import reference as ref
from oscar_zoo.kernels._launch import kernel
from oscar_zoo.zoo.errors import InvalidInput

from .conftest import random_orthogonal, run_poisoned, same_bits, signed_permutation

CASES = [  # d, group_size, scale dtype, x dtype, rotation kind, clip
    (64, None, torch.float32, torch.float32, "perm_heads", [0.96, 0.9, 0.0]),
    (128, 32, torch.float16, torch.bfloat16, "perm", 0.92),
    (128, 16, torch.bfloat16, torch.float32, None, [1.0, 0.5, 0.96]),
    (64, 32, torch.float32, torch.float16, "perm", [0.97, 0.8, -1.0]),
    (128, 64, torch.float32, torch.bfloat16, "perm_heads", [0.96, 0.85, 0.62]),
    # past FUSED_MAX_D the rotation is a matmul ahead of the kernel (R no longer fits beside x)
    (256, None, torch.float32, torch.bfloat16, "perm_heads", [0.96, 0.92, 0.9]),
    (256, 64, torch.float16, torch.float32, "perm", [0.96, 0.5, 0.0]),
]


def _rotation(kind, h, d, gen):
    if kind is None:
        return None
    if kind == "perm":
        return signed_permutation(d, gen)
    return torch.stack([signed_permutation(d, gen) for _ in range(h)])


@pytest.mark.parametrize("d,gs,sdt,xdt,rot,clip", CASES)
@pytest.mark.parametrize("centered", [False, True])
def test_bit_exact_with_exact_rotation(device, d, gs, sdt, xdt, rot, clip, centered):
    gen = torch.Generator().manual_seed(d + (gs or 0) + centered)
    t, h = 203, 3                                                   # not a multiple of any block
    x = (torch.randn(t, h, d, generator=gen) * 2 + torch.randn(h, d, generator=gen) * 3).to(xdt)
    r = _rotation(rot, h, d, gen)
    mean = torch.randn(h, d, generator=gen) * 3 if centered else None
    args = (x.to(device), None if r is None else r.to(device), clip, gs, sdt)
    packed, sz = run_poisoned(lambda: quantize_kv(*args, mean=None if mean is None else mean.to(device)))
    rp, rsz = ref.ref_quantize_kv(x, r, clip, gs, sdt, mean=mean)
    assert packed.shape == (t, h, d // 4) and packed.dtype == torch.uint8
    assert sz.shape == (t, h, 2 * (d // (gs or d))) and sz.dtype == sdt
    assert torch.equal(packed.cpu(), rp)
    assert same_bits(sz.cpu(), rsz)


@pytest.mark.parametrize("gs", [4, 16, 64])
def test_a_group_wholly_beyond_the_threshold_is_clamped(device, gs):
    """Groups smaller than a row can lie wholly above thr (or below -thr): the kernel clamped
    only the group's max (min) and dequantized such a group to its unclamped minimum."""
    gen = torch.Generator().manual_seed(gs)
    ramp = torch.linspace(0.5, 1.5, 128)                        # one sign, so the top half is clamped
    x = torch.stack([ramp, -ramp, ramp.flip(0), torch.randn(128, generator=gen) + 4.0])
    x = x[:, None, :].repeat(1, 2, 1)                           # [4 tokens, 2 heads, 128]
    for clip in (0.5, 0.3):
        packed, sz = run_poisoned(lambda: quantize_kv(x.to(device), None, clip, gs))
        rp, rsz = ref.ref_quantize_kv(x, None, clip, gs)
        assert torch.equal(packed.cpu(), rp) and same_bits(sz.cpu(), rsz), clip


def test_codes_match_the_literal_formula_except_at_rounding_ties(device):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(500, 2, 64, generator=gen)
    packed, sz = quantize_kv(x.to(device), None, [0.9, 0.96], 32)
    codes = ref.unpack_codes(packed.cpu())
    lit = ref.literal_codes(x, [0.9, 0.96], sz.cpu())
    # where the two differ, x/scale + zero + 1/2 must sit on an integer within rounding
    s = sz.cpu()[..., 0::2].double().repeat_interleave(32, -1)
    z = sz.cpu()[..., 1::2].double().repeat_interleave(32, -1)
    thr = ref.ref_clip_threshold(x, [0.9, 0.96])[..., None]
    y = torch.maximum(torch.minimum(x.double(), thr), -thr) / s + z + 0.5
    diff = codes != lit
    assert diff.float().mean() < 1e-3
    assert ((y[diff] - y[diff].round()).abs() < 1e-5).all()


def test_clip_threshold_is_the_sort_quantile_with_ties(device):
    # integer data: many exact ties among the largest |x|, the case the kernel handles apart
    gen = torch.Generator().manual_seed(2)
    x = torch.randint(-4, 5, (300, 2, 64), generator=gen).float()
    x[5, 0] = 4.0                                                    # a row of one repeated value
    x[6, 1] = 0.0                                                    # a constant row
    for clip in (0.96, [0.9, 0.5]):
        packed, sz = run_poisoned(lambda: quantize_kv(x.to(device), None, clip, None))
        rp, rsz = ref.ref_quantize_kv(x, None, clip, None)
        assert torch.equal(packed.cpu(), rp) and same_bits(sz.cpu(), rsz)
    # and the threshold really is sort(|x|)[int(ratio * d)]: the clamp's max is it
    thr = ref.ref_clip_threshold(x, 0.9)
    assert torch.equal(thr, x.abs().sort(-1).values[..., int(0.9 * 64)].double())


def test_clip_threshold_on_outlier_rows(device):
    # rows whose k-th largest |x| sits far below their maximum (the passes from the max need
    # retries, the estimate from the mean |x| overshoots), beside ordinary rows, low and high ratios
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(150, 3, 128, generator=gen)
    x[::7, :, :3] *= 1e5                                             # 3 huge values per row
    x[3, 1] = torch.randn(128, generator=gen) * 1e-30                # tiny, distinct values
    for clip in ([0.62, 0.85, 0.96], 0.99):
        packed, sz = run_poisoned(lambda: quantize_kv(x.to(device), None, clip, 32))
        rp, rsz = ref.ref_quantize_kv(x, None, clip, 32)
        assert torch.equal(packed.cpu(), rp) and same_bits(sz.cpu(), rsz)


@pytest.mark.parametrize("kfast,ncap", [(0, 16), (0, 1), (128, 16)])
def test_both_threshold_paths_exact_at_any_clip(device, monkeypatch, kfast, ncap):
    # the passes from the max (k <= KFAST) and from an estimate are both exact for every k, and
    # so is the fallback behind a guess that lands more than NCAP passes off (NCAP 1: most rows):
    # KFAST and NCAP, speed tunings, must not be able to change a result
    monkeypatch.setattr(quantize_mod, "KFAST", kfast)
    monkeypatch.setattr(quantize_mod, "NCAP", ncap)
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(150, 3, 128, generator=gen)
    x[::9, :, :2] *= 50.0                                            # rows with outliers
    x[1::9] = _laplace((17, 3, 128), gen)                           # heavier tails than the guess
    for clip in ([0.99, 0.92, 0.85], [0.79, 0.6, 0.3], 0.01):      # k = 2, 11, 20; 27, 52, 90; 127
        packed, sz = run_poisoned(lambda: quantize_kv(x.to(device), None, clip, None, torch.float16))
        rp, rsz = ref.ref_quantize_kv(x, None, clip, None, torch.float16)
        assert torch.equal(packed.cpu(), rp) and same_bits(sz.cpu(), rsz)


def _laplace(shape, gen):
    u = torch.rand(shape, generator=gen) - 0.5
    return -torch.sign(u) * torch.log1p(-2 * u.abs())


def _walk(x_ptr, e_ptr, k, thr_ptr, good_ptr, BT: tl.constexpr, Q: tl.constexpr, NCAP: tl.constexpr,
                 INTERP: tl.constexpr):
    # x: [BT, 4Q] f32 rows; the estimate's walk alone, as the kernel calls it
    rows = tl.arange(0, BT)
    at = x_ptr + rows[:, None] * (4 * Q) + tl.arange(0, Q)[None, :]
    v0, v1, v2, v3 = tl.load(at), tl.load(at + Q), tl.load(at + 2 * Q), tl.load(at + 3 * Q)
    top = tl.max(tl.maximum(tl.maximum(tl.abs(v0), tl.abs(v1)), tl.maximum(tl.abs(v2), tl.abs(v3))), axis=1)
    every = rows >= 0
    thr, good = quantize_mod._passes_from_estimate(v0, v1, v2, v3, k, tl.load(e_ptr), tl.load(e_ptr + 1), top,
                                                   every, every, BT, Q, NCAP, INTERP)
    tl.store(thr_ptr + rows, thr)
    tl.store(good_ptr + rows, good.to(tl.int32))


walk = kernel(_walk)


@pytest.mark.parametrize("clip", [0.92, 0.7, 0.3])
def test_the_estimates_walk_vouches_for_most_rows_and_only_exact_ones(device, clip):
    """Results never ride on the guess (the fallback is exact), so only this sees a guess gone
    wrong: the walk must end on the exact k-th largest |x| where it vouches, and vouch for
    nearly every gaussian or heavy-tailed row."""
    gen = torch.Generator().manual_seed(14)
    x = torch.cat([torch.randn(64, 128, generator=gen), _laplace((64, 128), gen)]) * 3   # [rows, d]
    k = quantize_mod.clip_counts(clip, 1, 128)
    e = quantize_mod._estimate_coefficients(k, 128)[0]
    thr, good = torch.empty(128, device=device), torch.empty(128, dtype=torch.int32, device=device)
    walk.on(device)[(1,)](x.to(device), e.to(device), int(k), thr, good, BT=128, Q=32, NCAP=quantize_mod.NCAP,
                       INTERP=device.type == "cpu")
    want = x.abs().sort(-1, descending=True).values[:, int(k) - 1]
    good = good.cpu().bool()
    assert good.float().mean() > 0.95
    assert torch.equal(thr.cpu()[good], want[good])


@pytest.mark.parametrize("clip", [0.92, 0.85, 0.6, 0.3])
def test_the_estimate_lands_near_the_threshold_on_gaussian_rows(clip):
    """Speed, not results, rides on the guess: the Newton step from the mean |x| must bring the
    count of |x| >= t1 to within a few of k, or every block would run to NCAP and fall back."""
    gen = torch.Generator().manual_seed(12)
    x = torch.randn(4096, 128, generator=gen, dtype=torch.float64) * 3.0   # [rows, d]
    k = quantize_mod.clip_counts(clip, 1, 128)
    e1, e2 = quantize_mod._estimate_coefficients(k, 128)[0].double()
    a, s = x.abs(), x.abs().sum(1)
    c0 = (a >= (s * e1)[:, None]).sum(1)
    c1 = (a >= (s * (e1 + (c0 - k) * e2))[:, None]).sum(1)
    off0, off1 = (c0 - k).abs().double(), (c1 - k).abs().double()
    assert off0.median() <= 0.5 * float(k) ** 0.5 + 2     # t0: the count's own spread, no bias
    assert off1.mean() < 0.6 * off0.mean()                # the Newton step helps
    assert (off1 <= quantize_mod.NCAP).float().mean() > 0.999


RARE_ROWS = {   # rows the one-group-per-row fast path must hand to its exact fallback
    "no negative value": lambda r, g: r.abs() + 0.1,
    "no positive value": lambda r, g: -r.abs() - 0.1,
    "all zero": lambda r, g: r * 0.0,
    "all negative zero": lambda r, g: torch.full_like(r, -0.0),
    "top values far apart": lambda r, g: torch.cat([torch.tensor([1e6, -3e5]), r[2:]]),
    # the last pass's |x| - 5e4 rounds to 1/256: 2.9119 would come back as 2.91015625, between
    # the 6th and 7th largest, and without the check nothing else would notice
    "last pass inexact": lambda r, g: torch.cat([torch.tensor([1e6, -3e5, 2e5, -1e5, 5e4, 2.9119]),
                                                r[6:].clamp(-2.5, 2.5)]),
    "top values exactly halving": lambda r, g: torch.cat([torch.tensor([64.0, -32.0, 16.0, -8.0, 4.0]), r[5:]]),
    "subnormal values": lambda r, g: torch.randn(128, generator=g) * 1e-41,
    "ties at the top": lambda r, g: torch.cat([torch.tensor([5.0, -5.0, 5.0, 4.0, -4.0, 3.5, 3.5, -3.5]), r[8:]]),
    "many zeros": lambda r, g: r * (torch.arange(128) % 2),
}


@pytest.mark.parametrize("kind", RARE_ROWS)
def test_whole_row_group_rare_rows(device, kind):
    # each alone among ordinary rows (a block with any rare row takes the fallback whole)
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(70, 1, 128, generator=gen)
    x[66, 0] = RARE_ROWS[kind](x[66, 0], gen)
    for clip in (0.96, 0.92, 0.6):
        packed, sz = run_poisoned(lambda: quantize_kv(x.to(device), None, clip, None))
        rp, rsz = ref.ref_quantize_kv(x, None, clip, None)
        assert torch.equal(packed.cpu(), rp) and same_bits(sz.cpu(), rsz)


def _hopper(device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] == 9


@pytest.mark.parametrize("xdt,sdt,centered,shared", [
    (torch.bfloat16, torch.float16, True, False), (torch.bfloat16, torch.float32, False, True),
    (torch.float16, torch.bfloat16, True, True), (torch.float16, torch.float16, False, False)])
def test_the_hopper_kernels_calls_bit_exact(device, xdt, sdt, centered, shared):
    """The calls quantize_hopper.py takes on a Hopper GPU (16-bit x, a rotation, d = 128, one group),
    here the same calls on any device: every rare row kind among ordinary rows (their blocks take
    that kernel's exact paths in place), per-head clips k = 6, 9 and 0 (passes from the max) and
    k = 11, 20 and 39 (from the estimate)."""
    gen = torch.Generator().manual_seed(11)
    t, h, d = 333, 3, 128
    y = torch.randn(t, h, d, generator=gen) * 2                  # y: [tokens, heads, d], after R
    # Not rows of zeros or subnormals: the sign of a zero sum of products (and whether subnormal
    # products flush) is the matmul's, not the quantizer's, and float64 products, the interpreter
    # and the tensor cores differ there; R = None covers those rows. fp16 x: scaled into range.
    kinds = [k for k in RARE_ROWS if not k.startswith("all") and k != "subnormal values"]
    for j, kind in enumerate(kinds):                              # one in each of the first blocks, two in some
        y[5 + 29 * j, j % h] = RARE_ROWS[kind](y[5 + 29 * j, j % h], gen) * (1.0 if xdt == torch.bfloat16 else 2.0 ** -6)
    r = torch.stack([signed_permutation(d, gen) for _ in range(h)])
    x = torch.einsum("thd,hed->the", y, r).to(xdt).contiguous()  # x @ R is y, rounded as x was
    if shared:                                                    # one R for every head
        r = r[0]
        x = (y @ r.T).to(xdt)
    mean = torch.randn(h, d, generator=gen) if centered else None
    prep = prepare_rotation(r, mean, dtype=xdt, device=device)
    xd = x.to(device)
    if _hopper(device):
        assert quantize_mod._hopper_applies(xd, prep.r, 1)
    for clip in ([0.96, 0.93, 1.0], [0.92, 0.85, 0.7]):
        packed, sz = run_poisoned(lambda: quantize_kv(xd, prep, clip, None, sdt))
        rp, rsz = ref.ref_quantize_kv(x, r, clip, None, sdt, mean=mean)
        assert torch.equal(packed.cpu(), rp) and same_bits(sz.cpu(), rsz), clip


@pytest.mark.parametrize("t", [1, 64, 203, 4099])
def test_the_hopper_kernel_matches_the_triton_kernel_bit_for_bit(device, t, monkeypatch):
    """On a Hopper GPU, with a general rotation (products rounded), both kernels compute the same
    tensor-core products and the same selection: identical outputs, also for x whose tokens are
    strided (a slice of a wider cache), rows with outlier channels, and (uncentered) rows of zeros
    or of one sign, which take the rare path's own min and max."""
    if not _hopper(device):
        pytest.skip("the Gluon kernel runs on Hopper GPUs only")
    gen = torch.Generator().manual_seed(t)
    h, d = 4, 128
    r = random_orthogonal(h, d, d, gen=gen)
    wide = torch.randn(t, 2 * h, d, generator=gen)
    wide[:, :, :2] *= 20
    for i in range(0, t, 3):                                      # after R: zeros, > 0, < 0
        wide[i, i % h] = torch.einsum("e,de->d", (torch.rand(d, generator=gen) + 1) * (i % 9 - 4), r[i % h])
    x = wide.bfloat16()[:, :h].to(device)                         # token stride 2 h d
    for mean in (torch.randn(h, d, generator=gen), None):
        prep = prepare_rotation(r, mean, dtype=torch.bfloat16, device=device)
        assert quantize_mod._hopper_applies(x, prep.r, 1)
        for clip in ([0.96, 0.93, 1.0, 0.0], 0.96, [0.92, 0.85, 0.7, 0.5]):
            got = run_poisoned(lambda: quantize_kv(x, prep, clip, None, torch.float16))
            monkeypatch.setattr(quantize_mod, "HOPPER", False)
            want = quantize_kv(x, prep, clip, None, torch.float16)
            monkeypatch.setattr(quantize_mod, "HOPPER", True)
            assert torch.equal(got[0], want[0]) and same_bits(got[1], want[1])


def test_hopper_applies_only_to_tokens_a_tma_tile_can_read(device):
    """Tokens that overlap (a broadcast x) and an interpreted CUDA device take quantize.py's kernel."""
    if not _hopper(device):
        pytest.skip("the Gluon kernel runs on Hopper GPUs only")
    prep = prepare_rotation(torch.eye(128), None, dtype=torch.bfloat16, device=device)
    row = torch.randn(1, 2, 128, device=device).bfloat16()
    assert quantize_mod._hopper_applies(row.expand(8, 2, 128).contiguous(), prep.r, 1)
    assert not quantize_mod._hopper_applies(row.expand(8, 2, 128), prep.r, 1)
    got = run_poisoned(lambda: quantize_kv(row.expand(8, 2, 128), prep, 0.96, None))
    want = quantize_kv(row.expand(8, 2, 128).contiguous(), prep, 0.96, None)
    assert torch.equal(got[0], want[0]) and same_bits(got[1], want[1])


def test_general_rotation_close_to_reference(device):
    gen = torch.Generator().manual_seed(3)
    t, h, d = 257, 2, 128
    x = torch.randn(t, h, d, generator=gen) + 4 * torch.randn(h, d, generator=gen)
    r = random_orthogonal(h, d, d, gen=gen)
    mean = x.mean(0)
    packed, sz = quantize_kv(x.to(device), r.to(device), 0.96, None, mean=mean.to(device))
    rp, rsz = ref.ref_quantize_kv(x, r, 0.96, None, mean=mean)
    # float32 matrix products in another order: scales agree closely, codes bar rare ties
    torch.testing.assert_close(sz.cpu(), rsz, rtol=1e-5, atol=1e-5)
    assert (ref.unpack_codes(packed.cpu()) != ref.unpack_codes(rp)).float().mean() < 1e-3
    # 16-bit input uses a bf16 rotation on the tensor cores: the reconstruction stays as good
    xb = x.bfloat16()
    got = fake_quantize_kv(xb.to(device), r.to(device), 0.96, mean=mean.to(device)).cpu().double()
    want = ref.ref_fake_quantize_kv(xb, r, 0.96, mean=mean)
    rot = ref.ref_rotate(xb, r, mean)
    err_got, err_want = (got - rot).norm(), (want - rot).norm()
    assert err_got < 1.05 * err_want
    assert (got - want).norm() / want.norm() < 0.1


def test_centering_is_applied_in_the_rotated_basis(device):
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(100, 2, 64, generator=gen) + 10
    r = random_orthogonal(64, 64, gen=gen)
    mean = x.mean(0)
    got = fake_quantize_kv(x.to(device), r.to(device), 0.0, mean=mean.to(device)).cpu().double()
    target = ref.ref_rotate(x, r, mean)
    plain = fake_quantize_kv(x.to(device), r.to(device), 0.0).cpu().double()
    assert (got - target).norm() < 0.5 * (plain - ref.ref_rotate(x, r)).norm()


@pytest.mark.parametrize("sdt", [torch.float32, torch.float16, torch.bfloat16])
def test_scale_and_zero_are_correctly_rounded_over_wide_ranges(device, sdt):
    # the kernel computes scale and zero without float64 divisions (a correction step for / 3,
    # float32 div_rn for zero, one FMA per code threshold): every group's scale and zero must
    # still be the float64 reference's, over magnitudes from 2^-20 to 2^20 and off-center groups
    # (an approximate reciprocal for zero fails this with float32 storage)
    gen = torch.Generator().manual_seed(11)
    t, h, d, gs = 512, 2, 64, 16
    mag = torch.exp2(torch.randint(-20, 21, (t, h, 1), generator=gen).double())
    x = ((torch.randn(t, h, d, generator=gen) + 4 * torch.rand(t, h, 1, generator=gen) - 2) * mag).float()
    packed, sz = run_poisoned(lambda: quantize_kv(x.to(device), None, 0.0, gs, sdt))
    rp, rsz = ref.ref_quantize_kv(x, None, 0.0, gs, sdt)
    assert same_bits(sz.cpu(), rsz)
    assert torch.equal(packed.cpu(), rp)


def test_roundtrip_error_is_within_half_a_step(device):
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(64, 2, 64, generator=gen)
    packed, sz = quantize_kv(x.to(device), None, 0.0, 16)
    xh = dequantize_kv(packed, sz, 16).cpu().double()
    step = sz.cpu()[..., 0::2].double().repeat_interleave(16, -1)
    assert ((xh - x.double()).abs() <= 0.5 * step * (1 + 1e-6) + 1e-7).all()


def test_empty_and_bad_input(device):
    p, s = quantize_kv(torch.zeros(0, 2, 64, device=device), None, 0.9)
    assert p.shape == (0, 2, 16) and s.shape == (0, 2, 2)
    with pytest.raises(InvalidInput, match="head_dim"):
        quantize_kv(torch.zeros(4, 2, 48, device=device), None, 0.9)
    with pytest.raises(InvalidInput, match="group_size"):
        quantize_kv(torch.zeros(4, 2, 64, device=device), None, 0.9, group_size=24)
    with pytest.raises(InvalidInput, match="rotation"):
        quantize_kv(torch.zeros(4, 2, 64, device=device), torch.eye(32, device=device), 0.9)
    with pytest.raises(InvalidInput, match="clip"):
        quantize_kv(torch.zeros(4, 2, 64, device=device), None, [0.9, 0.9, 0.9])
    with pytest.raises(InvalidInput, match="mean"):
        quantize_kv(torch.zeros(4, 2, 64, device=device), None, 0.9, mean=torch.zeros(3, 64, device=device))


def test_clip_shapes_per_head(device):
    """A clip tensor is one ratio, or one per KV head along one axis ([H], [H, 1], [1, H]).
    A [2, 2] for 4 heads used to be flattened into 4 per-head ratios without a word (a table
    of clip per (layer, head), or per (K, V), passed whole), as was [2, 1, 2]."""
    gen = torch.Generator().manual_seed(13)
    x = torch.randn(40, 4, 64, generator=gen)
    ratios = [0.96, 0.5, 0.0, 0.8]
    want = ref.ref_quantize_kv(x, None, ratios, 16)
    for clip in (torch.tensor(ratios), torch.tensor(ratios)[:, None], torch.tensor([ratios])):
        packed, sz = quantize_kv(x.to(device), None, clip, 16)
        assert torch.equal(packed.cpu(), want[0]) and same_bits(sz.cpu(), want[1]), tuple(clip.shape)
    for clip in (torch.tensor(ratios).view(2, 2), torch.rand(4, 4), torch.rand(2, 1, 2)):
        with pytest.raises(InvalidInput, match=r"clip must be .*kv_heads=4"):
            quantize_kv(x.to(device), None, clip, 16)


def test_a_triton_that_cannot_compile_the_gluon_kernel_falls_back_with_a_warning(device, monkeypatch):
    """Gluon is experimental: where a Triton release no longer compiles quantize_hopper.py's
    kernel (simulated by its launcher raising as the compiler would), quantize_kv warns once,
    names the fix and computes the same bits with quantize.py's kernel."""
    if not _hopper(device):
        pytest.skip("the Gluon kernel runs on Hopper GPUs only")
    from triton.compiler.errors import CompilationError

    from oscar_zoo.kernels import quantize_hopper

    def broken(*args, **kwargs):
        raise CompilationError(None, None, "gluon.language has no attribute 'warpgroup_mma'")

    gen = torch.Generator().manual_seed(5)
    x = torch.randn(100, 2, 128, generator=gen).bfloat16().to(device)
    prep = prepare_rotation(random_orthogonal(2, 128, 128, gen=gen), None, dtype=torch.bfloat16, device=device)
    want = quantize_kv(x, prep, 0.96, None)
    monkeypatch.setattr(quantize_hopper, "quantize", broken)
    monkeypatch.setattr(quantize_mod, "HOPPER", True)
    with pytest.warns(RuntimeWarning, match=r"warpgroup_mma.*pip install triton==3\.6\.0"):
        got = run_poisoned(lambda: quantize_kv(x, prep, 0.96, None))
    assert torch.equal(got[0], want[0]) and same_bits(got[1], want[1])
    assert quantize_mod.HOPPER is False                 # once: later calls go straight to quantize.py
