"""Mirroring published bundles to the Hugging Face Hub and ModelScope (zoo/mirror/runner.py)."""
