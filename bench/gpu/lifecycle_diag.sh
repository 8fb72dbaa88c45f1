#!/usr/bin/env bash
# On the GPU machine: the CUDA watch/unwatch lifecycle with freshly forked DataLoader workers,
# with faulthandler on (a worker that aborts prints every thread's Python stack), once as
# shipped and once with every setup lint off. Logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/ranksight-gpu-out}; mkdir -p "$OUT"
W=tests/integration_workloads/lifecycle_worker.py
export PYTHONFAULTHANDLER=1 RANKSIGHT_AGENT=off RANKSIGHT__hooks__table_every_steps=0 RANKSIGHT__hooks__table_every_seconds=0
run() {  # name, extra env...
  local name=$1; shift
  env "$@" timeout 150 python3 "$W" --cycles 100 --workers 2 --device cuda --fresh-every 4 --agent off --tmp /tmp \
    > "$OUT/$name.out" 2> "$OUT/$name.err"
  echo "$name rc=$? $(grep -c 'Fatal Python error' "$OUT/$name.err") fatal; $(grep -m1 'exited unexpectedly' "$OUT/$name.err")"
}
run shipped
LINTS_OFF=()
for l in io_amplification sampler_epoch rank_disagreement dataloader_workers_rss numa_binding uneven_last_batch \
         incomplete_checkpoint global_batch_lr disk_headroom; do LINTS_OFF+=("RANKSIGHT__lints__$l=false"); done
run lints_off "${LINTS_OFF[@]}"
grep -h -B2 -A25 "Fatal Python error" "$OUT"/*.err | head -80
