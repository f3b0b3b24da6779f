"""Streaming second moments for the OSCAR objectives (oscar-spec 2.2, 2.3), in float64.

Pass 1, per layer and KV head h (g query heads share it):
    M_q[h] = sum over tokens t and heads of the group of q q^T     (qqt)
    k_sum[h] = sum_t k_t       (key centering)       M_k[h] = sum_t k k^T   (ktk)
    M_v[h] = sum_t v v^T       (vtv)
Pass 2, with the final C_h = M_q[h] / n_q:
    e_t = k_t^T C_h k_t        (the expected squared logit of key t)
    S_v[h] = sum_t e_t v_t v_t^T,  e_sum[h] = sum_t e_t    (sst: S_v / e_sum)
Memory is O(kv_heads x d^2) per layer; nothing per token is kept.

A KV-shared layer (Gemma 3n, Gemma 4) attends over its source layer's stored K/V with its own
queries, so one rotation must serve every reader's q.k: add_queries() pools the readers' M_q
into the source's before pass 2, and C_h then averages q q^T over every query row that ever
meets those keys (pass 2's e_t with it is the summed expected squared logit over the readers).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class LayerMoments:
    kv_heads: int
    head_dim: int
    want_ktk: bool = False
    want_vtv: bool = False

    def __post_init__(self):
        self.n_q = 0      # q rows per KV head seen (tokens x g)
        self.n_k = 0      # tokens seen
        self._c = None    # C_h, frozen at the first pass-2 update
        self._alloc(torch.device("cpu"))

    def _alloc(self, device: torch.device) -> None:
        # Accumulators live on the layer's own device (layers may sit on different GPUs), so
        # updates never synchronise with the host.
        h, d = self.kv_heads, self.head_dim
        z = lambda *s: torch.zeros(*s, dtype=torch.float64, device=device)  # noqa: E731
        self.m_q, self.k_sum, self.s_v, self.e_sum = z(h, d, d), z(h, d), z(h, d, d), z(h)
        self.m_k = z(h, d, d) if self.want_ktk else None
        self.m_v = z(h, d, d) if self.want_vtv else None

    def finite(self) -> torch.Tensor:
        """Whether every statistic is finite, as a bool tensor on the statistics' device (no
        host sync: the caller reads many layers' at once)."""
        stats = [s for s in (self.m_q, self.k_sum, self.s_v, self.e_sum, self.m_k, self.m_v)
                 if s is not None]
        return torch.stack([torch.isfinite(s).all() for s in stats]).all()

    def _on(self, device: torch.device) -> None:
        if self.m_q.device != device:
            if self.n_k or self.n_q:
                raise RuntimeError("a layer moved between devices during calibration")
            self._alloc(device)

    def update_pass1(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        # q: [B, Hq, T, d]; k, v: [B, Hkv, T, d]
        if self._c is not None:
            raise RuntimeError("pass 1 update after pass 2 began: C would be stale")
        self._on(q.device)
        b, hq, t, _ = q.shape
        g = hq // self.kv_heads
        # One Gram product per (window, query head), then summed per KV head: no permuted copy
        # of the float64 queries (the largest tensor of the pass) is ever made.
        self.m_q += gram(_f64(q)).view(b, self.kv_heads, g, *self.m_q.shape[1:]).sum((0, 2))
        self.n_q += b * g * t
        self.k_sum += k.detach().sum((0, 2), dtype=torch.float64)
        self.n_k += b * t
        if self.m_k is not None:
            self.m_k += gram(_f64(k)).sum(0)
        if self.m_v is not None:
            self.m_v += gram(_f64(v)).sum(0)

    def add_queries(self, reader: "LayerMoments") -> None:
        """Pool a KV-shared reader's query moment into this layer's (its source's): M_q and n_q
        are sums over query rows, so the pooled C_h weighs every row that reads these keys alike.
        Only the queries: the reader's keys and values are this layer's own."""
        if self._c is not None:
            raise RuntimeError("queries pooled after pass 2 began: C would be stale")
        if reader.m_q.shape != self.m_q.shape:
            raise RuntimeError(f"a KV-shared layer's query moment {tuple(reader.m_q.shape)} cannot "
                               f"pool into its source's {tuple(self.m_q.shape)}")
        # [H, d, d]: the reader may sit on another GPU of a device_map'd model
        self.m_q += reader.m_q.to(self.m_q.device)
        self.n_q += reader.n_q

    def update_pass2(self, k: torch.Tensor, v: torch.Tensor) -> None:
        # Pass 1 is over by now, so C is final: computed once, not per call (small models on a
        # GPU are launch-bound, and every extra op per layer shows in the pass time).
        if self._c is None:
            self._c = self.q_cov()                                                # [H, d, d]
        k64, v64 = _f64(k), _f64(v)                                               # [B, H, T, d]
        e = ((k64 @ self._c) * k64).sum(-1).clamp_min_(0)                         # [B, H, T]
        self.e_sum += e.sum((0, 2))
        self.s_v += gram(v64 * e.sqrt_().unsqueeze(-1)).sum(0)                  # [B, H, d, d] summed

    # --- finished statistics -----------------------------------------------------------------

    def q_cov(self) -> torch.Tensor:
        """C_h = Q_g^T Q_g / (T g), per KV head: [H, d, d]."""
        return self.m_q / max(self.n_q, 1)

    def k_mean(self) -> torch.Tensor:
        return self.k_sum / max(self.n_k, 1)                                      # [H, d]

    def k_cov(self) -> torch.Tensor:
        return self.m_k / max(self.n_k, 1)

    def v_cov(self) -> torch.Tensor:
        return self.m_v / max(self.n_k, 1)

    def sst_cov(self) -> torch.Tensor:
        """sum_t e_t v v^T / sum_t e_t per head (= OSCAR's w normalised to mean 1)."""
        return self.s_v / self.e_sum.clamp_min(1e-12)[:, None, None]


def gram(x: torch.Tensor) -> torch.Tensor:
    """x^T x per leading index: [..., rows, d] -> [..., d, d] (one batched GEMM)."""
    return x.transpose(-1, -2) @ x


def _f64(x: torch.Tensor) -> torch.Tensor:
    # [B, H, T, d] in float64, written contiguously whatever the input's strides (attention
    # hands q as a transposed view), so every later op is a plain batched one.
    return x.detach().to(torch.float64, memory_format=torch.contiguous_format)
