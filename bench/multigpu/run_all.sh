#!/usr/bin/env bash
# Every multi-GPU run on a 2-8 GPU machine, in one command (run from the repo root):
#
#   bash bench/multigpu/prepare.sh        # here, once: copies the Prometheus binary into .devbin/ (ignored)
#   (device tool) run kind=nvidia-h200-x2 carry=[".devbin"] command="bash bench/multigpu/run_all.sh"
#
# Installs the project (pip -e, or a PYTHONPATH overlay), then bench/multigpu/orchestrate.py runs
# comm (DDP, FSDP2) vs the profiler, the Flight Recorder, the straggler (real Prometheus when
# .devbin/prometheus travelled, else the rule computed from /metrics), the hang and the overhead at
# 2 and all GPUs. Results: $OUT/multigpu_results.tgz (summary.json inside) and $OUT/multigpu.log.
# NCCL_NVLS_ENABLE=0 (NVLink multicast off) is exported for every process.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/ranksight-multigpu-out}
DEADLINE=${RANKSIGHT_MG_DEADLINE:-540}
R=/tmp/ranksight-multigpu
rm -rf "$R"; mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONDONTWRITEBYTECODE=1
unset TORCH_NCCL_ENABLE_TIMING TORCH_NCCL_TRACE_BUFFER_SIZE TORCH_FR_BUFFER_SIZE
[[ -x .devbin/prometheus ]] && export RANKSIGHT_PROMETHEUS="$PWD/.devbin/prometheus"
. bench/gpu/checkout_env.sh  # PY, and this checkout importable as ranksight
{ nvidia-smi -L; nvidia-smi topo -m; $PY -c 'import torch; print(torch.__version__, torch.cuda.device_count(), torch.cuda.nccl.version())'; } 2>&1 | tee "$R/env.log"
timeout --kill-after=10 $((DEADLINE + 15)) $PY bench/multigpu/orchestrate.py --out "$R" --deadline "$DEADLINE" \
  > >(tee "$R/orchestrate.log") 2>&1
echo "orchestrate rc=$?" | tee -a "$R/orchestrate.log"
rm -rf "$R"/traces "$R"/prometheus/data
tar -C "$R" -czf "$OUT/multigpu_results.tgz" . 2>/dev/null
cp "$R/orchestrate.log" "$OUT/multigpu.log"
