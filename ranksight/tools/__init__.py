"""The launchers: a local Prometheus + Alertmanager (``stack``), the demo, the ``triage`` CLI and
the datagram receiver used by tests and benches. They run the contract in ``ranksight`` and the
agent in ``ranksight.exporter``; nothing in the contract imports them."""
