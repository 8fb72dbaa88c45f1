"""The tools: a local Prometheus + Alertmanager (``stack``), the demo, the ``triage`` CLI, the
datagram receiver used by tests and benches, the benchmarks' entry (``bench``), the Kubernetes
manifests (``k8s``) and ``ranksight config`` (``config_cli``). They run the contract in
``ranksight`` and the agent in ``ranksight.exporter``; nothing in the contract imports them."""
