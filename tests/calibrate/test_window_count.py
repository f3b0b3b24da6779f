"""How many tokens a sliding-window layer is counted with in bits_at_context, against what
transformers' own cache and attention do on a tiny random Gemma 3 (no downloads).

transformers' DynamicCache keeps W - 1 of a sliding layer's past tokens between steps
(cache_utils.DynamicSlidingWindowLayer.update: `full_key_states[:, :, -self.sliding_window + 1 :, :]`),
and the next token attends those and itself: W keys (masking_utils.sliding_window_overlay:
`kv_idx > q_idx - sliding_window`). A full layer likewise holds L - 1 past tokens when the L-th
attends, L keys with itself. bits_at_context counts every layer at that one moment, the L-th
token's attention (L keys on a full layer, W on a sliding one), which is also the last query
validation's emulation measures; counting W - 1 would mix the sliding layer's count after the
step with the full layer's during it.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from oscar_zoo.calibrate import capture
from oscar_zoo.calibrate.loading import model_geometry
from oscar_zoo.calibrate.validate import _bits_at_context

transformers = pytest.importorskip("transformers")

W, L, SINK, RECENT = 16, 40, 4, 8
# an INT2 tier of 3 bits: fp32 scale and zero per group of 64
SCALES = SimpleNamespace(scale_dtype="float32", group_size=64, sink_tokens=SINK, recent_tokens=RECENT)


def _gemma3():
    torch.manual_seed(0)
    config = transformers.Gemma3TextConfig(
        vocab_size=128, hidden_size=128, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, sliding_window=W,
        layer_types=["sliding_attention", "full_attention"], max_position_embeddings=256)
    model = transformers.Gemma3ForCausalLM(config).eval()
    capture.install(model)
    return model


def _keys_read(model, forward) -> dict[int, int]:
    """Per layer, the keys the last query may attend in `forward`'s attention call."""
    read = {}

    def observer(module, q, k, v, mask, kw):
        allowed = capture.bool_mask(mask, q.shape[2], k.shape[2], q.device)[0, 0, -1]
        read[module.layer_idx] = int(allowed.sum())

    with torch.no_grad(), capture.observing(observer):
        forward()
    return read


def _bits_of(read: dict[int, int]) -> float:
    """Bits per element of the last `read[i]` positions of L on each layer (equal widths): BF16
    for the sequence's first SINK and last RECENT positions, 3 bits for the rest."""
    bits = positions = 0
    for n in read.values():
        for p in range(L - n, L):
            bits += 16 if p < SINK or p >= L - RECENT else 3
            positions += 1
    return bits / positions


def test_a_sliding_layer_is_counted_as_the_keys_the_last_token_reads():
    model = _gemma3()
    ids = torch.randint(0, 128, (1, L), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        cache = model(ids[:, :L - 1], use_cache=True).past_key_values
    decode = _keys_read(model, lambda: model(ids[:, L - 1:], cache=cache, use_cache=True))
    kept = [layer.keys.shape[2] for layer in cache.layers]
    assert decode == {0: W, 1: L} and kept == [W - 1, L]    # W - 1 kept, W read, beside L and L
    # validation's forward (no cache): its last query reads what the decode step read
    assert _keys_read(model, lambda: model(ids, use_cache=False)) == decode
    bits, windows = _bits_at_context(SCALES, L, model_geometry(model), model.config)
    assert windows == {"0": W}
    assert bits == pytest.approx(_bits_of(decode), rel=1e-12)
    assert bits != pytest.approx(_bits_of({0: W - 1, 1: L}), rel=1e-6)    # the count after the step
