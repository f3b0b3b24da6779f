"""Interop with OSCAR's own rotation checkpoints (SGLang .pt files)."""
