"""Plumbing shared by the rooms above the contract (``tools/``, ``report/``, the benchmarks and the
tests): free ports, process start and stop, the Prometheus and Alertmanager HTTP clients
(``plumbing.py``). It imports only the standard library."""
