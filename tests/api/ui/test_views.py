"""What the pages show, as text: per-layer geometry."""

from __future__ import annotations

from oscar_zoo.api.ui.views import kv_geometry, per_layer


def test_per_layer_names_the_layers_that_differ():
    assert per_layer(64, {}) == "64" and per_layer(64, None) == "64"
    assert per_layer(64, {"2": 128}) == "64 (128 on 1 layer: 2)"
    assert per_layer(2, {"3": 1, "1": 4, "9": 4, "5": 2}) == "2 (1 on 1 layer: 3; 4 on 2 layers: 1, 9)"
    assert per_layer(8, {str(i): 16 for i in range(0, 10, 2)}, shown=2) == "8 (16 on 5 layers: 0, 2, ...)"


def test_kv_geometry_reads_a_stored_geometry():
    geometry = {"num_kv_heads": 2, "head_dim": 64, "kv_heads_by_layer": {"1": 4},
                "head_dim_by_layer": {}}
    assert kv_geometry(geometry) == {"kv_heads": "2 (4 on 1 layer: 1)", "head_dim": "64"}
    assert kv_geometry({"num_kv_heads": 8, "head_dim": 128}) == {"kv_heads": "8", "head_dim": "128"}
