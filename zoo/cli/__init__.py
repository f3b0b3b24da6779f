"""The `oscar-zoo` command line. One module per command family; main.py wires them together."""
