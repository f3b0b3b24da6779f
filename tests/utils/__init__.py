"""Test helpers shared across areas: `from tests.utils.bundles import make_bundle` works under
pytest's importlib mode (tests/ and its areas have no __init__.py; this folder has one)."""
