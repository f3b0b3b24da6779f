"""The mixed BF16 + INT2 KV cache of one attention layer for a batch of sequences.

Per sequence of length L (oscar-spec 3.5): the first `sink` tokens and the last `recent` tokens
stay BF16; the INT2 history is everything between. All rows are stored in the rotated basis,
keys centered first: k_stored = (k - mean) @ R_k, v_stored = v @ R_v.

Layout (ours; SGLang's pool differs, see oscar-spec 3.3):
- BF16 tier, per sequence: `hp_k`, `hp_v` [batch, kv_heads, sink + recent, d]; rows [0, sink)
  hold the sink, rows [sink, sink + recent) the recent window. With L < sink + recent the
  sink holds min(L, sink) tokens and the recent part the rest; unused rows are never read.
- INT2 tier, paged: `k_packed`, `v_packed` [num_pages, kv_heads, page_size, d/4] uint8 and
  `k_sz`, `v_sz` [num_pages, kv_heads, page_size, 2*groups] (scale, zero interleaved). Heads
  are outside the page so one (page, head) is one contiguous block: the decode kernel streams
  it with wide loads. INT2 token t of sequence b sits in page `block_table[b, t // page_size]`,
  slot t % page_size.

The decode kernel reads these buffers by raw offsets, so a cache built directly (not by
`from_dense`) is checked when it is made (`__post_init__`): shapes, dtypes, one device,
contiguous buffers (a strided view would be read as if it were contiguous: wrong rows, no
error), and that every sequence's INT2 history fits its block table row, points at existing
pages and is covered by `max_int2_len` (the kernel grid; tokens past it were skipped). The
last checks read seq_lens and the block table on the host (one sync per cache made, none per
decode step); they are skipped while a CUDA graph is being captured.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch

from . import _args
from .quantize import quantize_kv
from .reference import rotate_heads


@dataclass(frozen=True)
class Int2KVCache:
    seq_lens: torch.Tensor          # [batch] int32: tokens per sequence, all tiers
    hp_k: torch.Tensor              # [batch, kv_heads, sink + recent, d] bf16
    hp_v: torch.Tensor              # [batch, kv_heads, sink + recent, d] bf16
    k_packed: torch.Tensor          # [num_pages, kv_heads, page_size, d/4] uint8
    k_sz: torch.Tensor              # [num_pages, kv_heads, page_size, 2*groups]
    v_packed: torch.Tensor
    v_sz: torch.Tensor
    block_table: torch.Tensor       # [batch, max_pages] int32
    k_rotation: torch.Tensor | None  # [d, d] or [kv_heads, d, d] float32; None = identity
    v_rotation: torch.Tensor | None
    sink: int
    recent: int
    group_size: int
    page_size: int
    max_int2_len: int               # longest INT2 history in the batch (sizes the kernel grid)

    def __post_init__(self):
        _check_layout(self)

    @property
    def int2_lens(self) -> torch.Tensor:
        return (self.seq_lens - (self.sink + self.recent)).clamp(min=0)

    @classmethod
    def from_dense(cls, keys, values, k_rotation, v_rotation, k_clip, v_clip, group_size=None,
                   scale_dtype=torch.float32, sink=64, recent=256, page_size=64, mean=None) -> "Int2KVCache":
        """Build the cache from per-sequence K and V ([len_b, kv_heads, d] each, original basis).
        INT2 rows go through `quantize_kv` (sort-semantics clip, per-head clip ratios allowed);
        BF16 rows are rotated in float64 and rounded once. Pages are handed out interleaved across
        sequences, so a sequence's pages are not contiguous (the block table is exercised)."""
        if len(keys) != len(values) or not keys:
            raise _args.InvalidInput("keys and values must be equal-length, non-empty lists of [len, kv_heads, d].")
        _, h, d = _args.check_x(keys[0], "keys[0]")
        for b, (k, v) in enumerate(zip(keys, values)):
            _args.check_x(k, f"keys[{b}]")
            _args.check_x(v, f"values[{b}]")
            if k.shape[1:] != (h, d) or v.shape != k.shape:
                raise _args.InvalidInput(f"keys[{b}] {tuple(k.shape)} and values[{b}] {tuple(v.shape)} "
                                         f"must both be [len_{b}, {h}, {d}], as keys[0] is.")
            if k.device != keys[0].device or v.device != keys[0].device:
                raise _args.InvalidInput(f"keys[{b}] ({k.device}) and values[{b}] ({v.device}) must be on "
                                         f"keys[0]'s device ({keys[0].device}): move them with .to().")
        ng = _args.group_count(d, group_size)
        if page_size < 1 or page_size & (page_size - 1):
            raise _args.InvalidInput(f"page_size must be a power of two, got {page_size}.")
        if sink < 0 or recent < 0:
            raise _args.InvalidInput("sink and recent must be >= 0.")
        _args.check_rotation(k_rotation, h, d, "k_rotation")
        _args.check_rotation(v_rotation, h, d, "v_rotation")
        _args.check_mean(mean, h, d)
        dev, bsz, hpw = keys[0].device, len(keys), sink + recent
        # the BF16 rows are rotated here, beside the keys: rotations (and mean) may come from anywhere
        k_rotation, v_rotation = (None if r is None else r.to(dev) for r in (k_rotation, v_rotation))
        lens = [int(k.shape[0]) for k in keys]
        n_q = [max(n - hpw, 0) for n in lens]
        pages_per = [-(-n // page_size) for n in n_q]
        max_pages = max(max(pages_per), 1)
        # page j of sequence b is page j * batch + b (interleaved); unused entries point at page 0
        table = torch.arange(max_pages)[None, :] * bsz + torch.arange(bsz)[:, None]
        table = torch.where(torch.arange(max_pages)[None, :] < torch.tensor(pages_per)[:, None], table, 0)
        num_pages = max_pages * bsz
        hp = {s: torch.zeros(bsz, h, hpw, d, dtype=torch.bfloat16, device=dev) for s in "kv"}
        tier = {"k": (k_rotation, k_clip, mean), "v": (v_rotation, v_clip, None)}
        packed = {s: torch.zeros(num_pages, h, page_size, d // 4, dtype=torch.uint8, device=dev) for s in "kv"}
        szs = {s: torch.zeros(num_pages, h, page_size, 2 * ng, dtype=scale_dtype, device=dev) for s in "kv"}
        for side, rows in (("k", keys), ("v", values)):
            rot, clip, mu = tier[side]
            mids, pg, slot = [], [], []
            for b, x in enumerate(rows):
                n = lens[b]
                n_sink = min(n, sink)
                n_rec = min(n, hpw) - n_sink
                centered = x if mu is None else x.double() - mu.double().to(dev)
                hp[side][b, :, :n_sink] = rotate_heads(centered[:n_sink], rot).transpose(0, 1).to(torch.bfloat16)
                hp[side][b, :, sink:sink + n_rec] = rotate_heads(centered[n - n_rec:], rot).transpose(0, 1).to(
                    torch.bfloat16)
                mids.append(x[n_sink:n_sink + n_q[b]])
                t = torch.arange(n_q[b])
                pg.append(table[b, t // page_size])
                slot.append(t % page_size)
            mid = torch.cat(mids, dim=0)
            if mid.shape[0]:
                qp, sz = quantize_kv(mid, rot, clip, group_size, scale_dtype, mean=mu)
                pgi, sli = torch.cat(pg).to(dev), torch.cat(slot).to(dev)
                packed[side][pgi, :, sli] = qp
                szs[side][pgi, :, sli] = sz
        f32 = (lambda r: None if r is None else r.to(device=dev, dtype=torch.float32).contiguous())
        return cls(torch.tensor(lens, dtype=torch.int32, device=dev), hp["k"], hp["v"], packed["k"], szs["k"],
                   packed["v"], szs["v"], table.to(device=dev, dtype=torch.int32), f32(k_rotation), f32(v_rotation),
                   sink, recent, d // ng, page_size, max(n_q))


def _check_layout(c: Int2KVCache) -> None:
    """What the decode kernel assumes of a cache (see the module docstring); InvalidInput otherwise."""
    bad = _args.InvalidInput
    for name in ("sink", "recent", "group_size", "page_size", "max_int2_len"):
        v = getattr(c, name)
        try:
            n = operator.index(v)       # numpy and 0-d integer tensors too, kept as a Python int
        except TypeError:
            n = -1
        if n < 0:
            raise bad(f"Int2KVCache.{name} must be an integer >= 0, got {v!r}.")
        object.__setattr__(c, name, n)
    if c.hp_k.dim() != 4:
        raise bad(f"hp_k must be [batch, kv_heads, sink + recent, head_dim], got shape {tuple(c.hp_k.shape)}.")
    bsz, h, hpw, d = c.hp_k.shape
    _args.check_head_dim(d)
    ng = _args.group_count(d, c.group_size)
    if c.page_size < 1 or c.page_size & (c.page_size - 1):
        raise bad(f"page_size must be a power of two, got {c.page_size}.")
    n_pages = c.k_packed.shape[0] if c.k_packed.dim() == 4 else "num_pages"
    want = {
        "hp_k": ((bsz, h, c.sink + c.recent, d), (torch.bfloat16,)),
        "hp_v": ((bsz, h, c.sink + c.recent, d), (torch.bfloat16,)),
        "k_packed": ((n_pages, h, c.page_size, d // 4), (torch.uint8,)),
        "v_packed": ((n_pages, h, c.page_size, d // 4), (torch.uint8,)),
        "k_sz": ((n_pages, h, c.page_size, 2 * ng), _args.SCALE_DTYPES),
        "v_sz": ((n_pages, h, c.page_size, 2 * ng), _args.SCALE_DTYPES),
        "seq_lens": ((bsz,), (torch.int32, torch.int64)),
        "block_table": ((bsz, c.block_table.shape[-1] if c.block_table.dim() else "max_pages"), (torch.int32, torch.int64)),
    }
    for rot in ("k_rotation", "v_rotation"):
        r = getattr(c, rot)
        if r is not None:
            _args.check_rotation(r, h, d, rot)
            want[rot] = (tuple(r.shape), (torch.float32,))
    dev = c.hp_k.device
    for name, (shape, dtypes) in want.items():
        t = getattr(c, name)
        if tuple(t.shape) != shape or t.dtype not in dtypes:
            kinds = " or ".join(str(x).replace("torch.", "") for x in dtypes)
            raise bad(f"Int2KVCache.{name} must be {kinds} of shape {list(shape)} (batch {bsz}, kv_heads {h}, "
                      f"sink + recent {c.sink + c.recent}, head_dim {d}, page_size {c.page_size}, {ng} group(s) "
                      f"per row), got {t.dtype} of shape {list(t.shape)}.")
        if t.device != dev:
            raise bad(f"Int2KVCache.{name} is on {t.device} but hp_k on {dev}: put every tensor of the cache on "
                      f"one device (.to(device)).")
        # the kernels index them as dense arrays; only the block table's row stride is free
        dense = (t.stride(-1) == 1 or t.shape[-1] <= 1) if name == "block_table" else t.is_contiguous()
        if not dense:
            raise bad(f"Int2KVCache.{name} must be contiguous (the kernel would read a strided view as if it "
                      f"were dense, giving wrong rows without an error): pass {name}.contiguous().")
    if c.seq_lens.is_cuda and torch.cuda.is_current_stream_capturing():
        return
    lens = c.seq_lens.tolist()
    n_q = [max(n - c.sink - c.recent, 0) for n in lens]
    table = c.block_table.cpu()
    for b, n in enumerate(lens):
        pages = -(-n_q[b] // c.page_size)
        if n < 0:
            raise bad(f"Int2KVCache.seq_lens[{b}] is {n}; lengths must be >= 0.")
        if n_q[b] > c.max_int2_len:
            raise bad(f"sequence {b} holds {n_q[b]} INT2 tokens (seq_len {n} - sink {c.sink} - recent {c.recent}) "
                      f"but max_int2_len is {c.max_int2_len}: the decode grid covers max_int2_len tokens and "
                      f"would skip the rest. Set max_int2_len to the longest INT2 history, {max(n_q)}.")
        if pages > table.shape[1]:
            raise bad(f"sequence {b} needs {pages} INT2 pages ({n_q[b]} tokens of {c.page_size}) but the block "
                      f"table has {table.shape[1]} columns: seq_lens[{b}] = {n} is longer than the cache holds.")
        row = table[b, :pages]
        if pages and (row.min() < 0 or row.max() >= n_pages):
            raise bad(f"block_table[{b}, :{pages}] points at pages outside [0, {n_pages}): "
                      f"{row.tolist()}.")
