#!/usr/bin/env bash
# Every single-GPU run on the GPU machine, in one command (run from the repo root):
#
#   bash bench/gpu/run_all.sh            # results in $OUT (the device tool's folder) or /tmp/ranksight-gpu-out
#   RANKSIGHT_STAGES="pytest overhead" bash bench/gpu/run_all.sh   # a subset (env and install always run)
#
# Stages (each under `timeout`, all within one deadline, the most important first):
#   env        nvidia-smi, torch/CUDA/NCCL/driver versions
#   install    pip install --no-deps -e . (the image has the dependencies); falls back to a
#              PYTHONPATH overlay that maps ranksight.hooks -> hooks/ etc. like pyproject's package-dir
#   pytest     tests/gpu -v (sync debug mode, profiler agreement, Flight Recorder, NVML/GPM, agent scrape,
#              async comm start after the enqueue and close() sending the last GPU times: test_gpu_enqueue_and_close.py)
#   nvml       bench/gpu/record_nvml.py: idle/steady/sawtooth/sawtooth_fast traces for the CPU fixtures
#   overhead   bench/gpu/overhead.py: interleaved plain/instrumented runs, medians
#   integrations_hf, integrations_lightning
#              bench/gpu/integrations.py overhead_hf|overhead_lightning: the framework callbacks'
#              overhead on a GPU-bound step (RANKSIGHT_INTEGRATIONS_ARGS, e.g. "--pairs 8"); not in
#              the default set
#   strategies bench/gpu/strategies.py: the hooks' overhead under DDP, FSDP, ZeRO-1/2/3 and a pipeline
#              (RANKSIGHT_STRATEGIES_ARGS; deepspeed from .devbin, carry it); not in the default set
# Everything lands in a staging folder that is packed into $OUT/gpu_results.tgz after each stage
# (so a stage killed at the deadline still leaves the earlier results), with the log beside it.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/ranksight-gpu-out}
DEADLINE=${RANKSIGHT_DEADLINE:-560}   # seconds for the whole script (the device tool allows 600)
R=/tmp/ranksight-gpu
rm -rf "$R"; mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export RANKSIGHT_GPU_OUT="$R" PYTHONDONTWRITEBYTECODE=1
unset TORCH_NCCL_ENABLE_TIMING TORCH_NCCL_TRACE_BUFFER_SIZE TORCH_FR_BUFFER_SIZE
PY=${PYTHON:-python3}

log() { echo "[$(date -u +%T) +${SECONDS}s] $*" | tee -a "$R/run_all.log"; }
pack() { tar -C "$R" -czf "$OUT/gpu_results.tgz" . 2>/dev/null; cp "$R/run_all.log" "$OUT/run_all.log" 2>/dev/null; true; }
STAGES=" ${RANKSIGHT_STAGES:-pytest nvml overhead} "
stage() {  # stage NAME LIMIT CMD...
  local name=$1 limit=$2; shift 2
  if [[ $name != env && $name != install && $STAGES != *" $name "* ]]; then return; fi
  local left=$((DEADLINE - SECONDS - 5))
  if (( left < 20 )); then log "== $name skipped: deadline"; echo "$name skipped" >> "$R/stages.txt"; pack; return; fi
  (( limit > left )) && limit=$left
  log "== $name (limit ${limit}s): $*"
  timeout --kill-after=10 "$limit" "$@" > >(tee "$R/$name.log") 2>&1
  local rc=$?
  log "== $name rc=$rc"
  echo "$name $rc" >> "$R/stages.txt"
  pack
}

stage env 60 bash -c "nvidia-smi; nvidia-smi -q | sed -n '1,40p'; $PY -c 'import torch,sys; print(sys.version); print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version(), torch.cuda.get_device_name(0), torch.cuda.device_count())'; $PY -c 'import pynvml,prometheus_client,psutil,yaml,pytest,setuptools; print(\"deps ok, setuptools\", setuptools.__version__)'; uname -a; nproc"

install_overlay() {
  local root=/tmp/rs-overlay
  rm -rf "$root"; mkdir -p "$root/ranksight"
  for f in ranksight/*; do ln -s "$PWD/$f" "$root/ranksight/"; done
  for sub in hooks exporter dashboards alerts; do ln -s "$PWD/$sub" "$root/ranksight/$sub"; done
  echo "$root"
}
if [[ -z "${RANKSIGHT_SKIP_INSTALL:-}" ]] && ! $PY -c 'import ranksight.hooks' 2>/dev/null; then
  stage install 150 $PY -m pip install -q --no-deps --no-build-isolation --no-cache-dir -e .
fi
if ! $PY -c 'import ranksight.hooks, ranksight.exporter.collectors.gpu' >> "$R/install.log" 2>&1; then
  export PYTHONPATH="$(install_overlay)${PYTHONPATH:+:$PYTHONPATH}"
  log "pip install -e failed; using the overlay PYTHONPATH=$PYTHONPATH"
  $PY -c 'import ranksight.hooks, ranksight.exporter.collectors.gpu; print("overlay ok")' 2>&1 | tee -a "$R/install.log"
fi

# most important first: if the deadline cuts the run short, the hooks results are in
# shellcheck disable=SC2086  # RANKSIGHT_PYTEST_ARGS / RANKSIGHT_OVERHEAD_ARGS are word-split on purpose
KARGS=(); [[ -n "${RANKSIGHT_PYTEST_K:-}" ]] && KARGS=(-k "$RANKSIGHT_PYTEST_K")
stage pytest 330 $PY -m pytest -v -rA -p no:cacheprovider --durations=15 "${KARGS[@]}" ${RANKSIGHT_PYTEST_ARGS:-} tests/gpu/test_gpu_hooks.py \
  tests/gpu/test_gpu_enqueue_and_close.py tests/gpu/test_gpu_nvml.py tests/gpu/test_gpu_flight_recorder.py tests/gpu/test_gpu_trace.py \
  tests/gpu/test_gpu_nvml_fixture.py
stage nvml 100 $PY bench/gpu/record_nvml.py --out "$R/h200_nvml_trace_2026-11-29.json"
stage overhead 200 $PY bench/gpu/overhead.py --out "$R/overhead.json" ${RANKSIGHT_OVERHEAD_ARGS:-}
stage integrations_hf 180 $PY bench/gpu/integrations.py overhead_hf --out "$R/integrations_hf.json" ${RANKSIGHT_INTEGRATIONS_ARGS:-}
stage integrations_lightning 180 $PY bench/gpu/integrations.py overhead_lightning --out "$R/integrations_lightning.json" ${RANKSIGHT_INTEGRATIONS_ARGS:-}
stage strategies 420 $PY bench/gpu/strategies.py --out "$R/strategies.json" ${RANKSIGHT_STRATEGIES_ARGS:-}
log "done"
pack
