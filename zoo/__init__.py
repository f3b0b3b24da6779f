"""oscar-zoo client and domain core: bundle format, model catalog, cache, pull, exporters, CLI."""

__version__ = "0.1.0"
