#!/usr/bin/env bash
# The headroom figures on the GPU machine in one command (from the repo root):
#
#   bash bench/gpu/headroom.sh            # results in $OUT (or /tmp/ranksight-gpu-out)
#
# 1. tests/gpu/test_gpu_event_record.py and test_gpu_trace.py: the step path's driver re-records
#    time what torch's records time, and every phase still agrees with the profiler;
# 2. bench/gpu/agent_bench.sh: the agent's CPU and RSS at 8 ranks x 100 steps/s with 15 s scrapes
#    on the host cores, the highest ingest rate without drops, and the overload with exact counts;
# 3. bench/gpu/overhead.py: the GPU-bound step (batch 32) and the host-bound ones, torch's
#    Event.record against the driver's cuEventRecord for re-recorded events (--record-ab).
# Each part has its own time limit (HEADROOM_TESTS_S, HEADROOM_AGENT_S, HEADROOM_OVERHEAD_S) and
# leaves its files in $OUT even when cut.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/ranksight-gpu-out}
mkdir -p "$OUT"
. bench/gpu/checkout_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1
echo "== tests"
timeout "${HEADROOM_TESTS_S:-110}" $PY -m pytest -q -rfE -p no:cacheprovider tests/gpu/test_gpu_event_record.py \
  tests/gpu/test_gpu_trace.py > "$OUT/headroom_tests.txt" 2>&1
echo "tests rc=$?"; tail -3 "$OUT/headroom_tests.txt"
echo "== agent"
OUT="$OUT" timeout "${HEADROOM_AGENT_S:-120}" bash bench/gpu/agent_bench.sh --cpu-seconds 40 --scrapes 100 \
  --rates 35000,50000,65000 --overload-rate 60000 --overload-senders 4
echo "agent rc=$?"
echo "== overhead"
timeout "${HEADROOM_OVERHEAD_S:-280}" $PY bench/gpu/overhead.py --out "$OUT/overhead.json" --modes "" --reps 20 \
  --record-ab --tiny-reps 6 > "$OUT/overhead.txt" 2>&1
echo "overhead rc=$?"; tail -25 "$OUT/overhead.txt"
