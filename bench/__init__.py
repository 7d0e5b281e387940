"""Benchmarks of nodewise against its peers: ``python -m bench [--quick] [--json PATH]``."""
