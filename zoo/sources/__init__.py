"""Where `pull` gets bundles: the registry, our hub mirrors, the public RotationZoo (HF Hub and
ModelScope). Each source turns (model, ref) into a Plan: which files to fetch and how to make a
canonical bundle of them; zoo/pull.py fetches, verifies and caches."""
