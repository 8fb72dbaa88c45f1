#!/usr/bin/env bash
# The node agent benchmark on the GPU machine (its host cores; the GPUs are stand-ins), one command
# from the repo root:
#
#   bash bench/gpu/agent_bench.sh            # JSON in $OUT/bench_exporter.json (or /tmp/ranksight-gpu-out)
#
# Makes the checkout importable (bench/gpu/checkout_env.sh: pip install --no-deps -e ., else a PYTHONPATH overlay that maps
# ranksight.exporter -> exporter/ etc.), then runs bench/bench_exporter.py --json (scrape p50/p99, CPU and
# RSS at 8 ranks x 100 steps/s with 15 s scrapes, and the highest ingest rate without drops).
# Extra arguments go to the benchmark, e.g. --rates 40000,50000,60000,70000,80000.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/ranksight-gpu-out}
mkdir -p "$OUT"
. bench/gpu/checkout_env.sh
nproc
timeout 540 $PY bench/bench_exporter.py --json "$@" > "$OUT/bench_exporter.json"
rc=$?
$PY - "$OUT/bench_exporter.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print("agent CPU %.2f%% of a core, RSS %.1f MB" % (d["agent_cpu_percent"], d["agent_rss_mb"]))
print("ingest max no drops %d/s:" % d["ingest"]["max_rate_no_drops_per_s"],
      [(t["sent_per_s"], t["dropped"]) for t in d["ingest"]["tried"]])
print("scrape p50/p99 ms", d["scrape_ms"]["agent"]["p50"], d["scrape_ms"]["agent"]["p99"], "meets", d["meets"])
PY
exit $rc
