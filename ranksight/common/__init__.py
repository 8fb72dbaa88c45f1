"""Plumbing shared by every room (the CLI, ``tools/``, ``report/``, the dashboards, the benchmarks and
the tests), written once: free ports, waits, the process handle and the Prometheus and Alertmanager
HTTP clients (``plumbing.py``), starting Prometheus and Alertmanager (``servers.py``), the error line
(``console.py``) and the value formatter (``units.py``). It imports only the standard library."""
