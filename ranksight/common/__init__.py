"""Plumbing shared by the rooms above the contract (``tools/``, ``report/``, the dashboards, the lints,
the benchmarks and the tests), written once: free ports, waits, the process handle and the Prometheus
and Alertmanager HTTP clients (``plumbing.py``), starting Prometheus and Alertmanager
(``servers.py``) and the value formatter (``units.py``). It imports only the standard library."""
