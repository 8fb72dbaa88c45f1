#!/usr/bin/env bash
# `ranksight bench scale` at full size (1,024 nodes x 8 GPUs x 8 ranks, 1 h at 15 s) on a
# machine with many idle cores, e.g. the GPU machine's 16 (the benchmark is CPU-bound: promtool
# and Prometheus; the GPU is not used). That machine has no Prometheus and no network, so:
#
#   here, once:   bash bench/scale/device.sh --prepare     # .devbin/: xz'd prometheus + promtool (and victoria-metrics +
#                                                          # vmalert where installed), PyYAML, the Grafana SDK
#   there:        bash bench/scale/device.sh [bench args]  # results in $OUT/scale.json and $OUT/scale.log
#                 ($OUT/scale-partial.json holds the result so far at each phase: a run cut at its limit
#                 still has the rule figures, which come before the dashboard queries)
#
# (with the device tool: run(carry=[".devbin"], command="bash bench/scale/device.sh --jobs 14"))
#
# The VictoriaMetrics layout (a store and vmalert) at the same size: add --engine victoriametrics; the
# unpacked binaries are first on PATH. Run the Prometheus and the VictoriaMetrics command on the same
# warm machine for a side-by-side ratio.
#
# 2,048 nodes within a 10-minute command: --nodes 2048 --hours 30m. Generation, backfill and
# compaction cost the samples (the same as 1,024 nodes over an hour); the live rule evaluation costs
# the series (twice 1,024 nodes'), and only the checkpoint share (1 h) and the NIC's best speed (1 d)
# read windows longer than the 30 minutes of data.
set -uo pipefail
cd "$(dirname "$0")/../.."
if [[ ${1:-} == --prepare ]]; then
  set -e
  mkdir -p .devbin
  for b in prometheus promtool; do xz -T0 -6 -c "$(command -v $b)" > .devbin/$b.xz; done
  for b in victoria-metrics vmalert; do  # apt-get install victoria-metrics (scripts/setup does)
    if command -v $b >/dev/null; then xz -T0 -6 -c "$(command -v $b)" > .devbin/$b.xz; else rm -f .devbin/$b.xz; fi
  done
  # pure-Python packages the dashboards builder and the config need (the GPU machine lacks them)
  rm -rf .devbin/py && mkdir -p .devbin/py
  for mod in yaml grafana_foundation_sdk; do
    cp -r "$(.venv/bin/python -c "import $mod, os; print(os.path.dirname($mod.__file__))")" .devbin/py/
  done
  find .devbin/py -name __pycache__ -prune -exec rm -rf {} +
  grep -qx '/.devbin/' .git/info/exclude 2>/dev/null || echo '/.devbin/' >> .git/info/exclude
  du -sh .devbin
  exit 0
fi
OUT=${OUT:-/tmp/ranksight-scale-out}
mkdir -p "$OUT" /tmp/rsbin
for b in prometheus promtool; do
  [[ -x /tmp/rsbin/$b ]] || { xz -dc .devbin/$b.xz > /tmp/rsbin/$b && chmod +x /tmp/rsbin/$b; } || {
    echo "device.sh: cannot unpack .devbin/$b.xz (run --prepare here and carry .devbin)" >&2; exit 2; }
done
for b in victoria-metrics vmalert; do
  [[ -f .devbin/$b.xz && ! -x /tmp/rsbin/$b ]] && { xz -dc .devbin/$b.xz > /tmp/rsbin/$b && chmod +x /tmp/rsbin/$b; }
done
export PATH="/tmp/rsbin:$PATH"
PY=${PYTHON:-python3}
python_path=""
$PY -c 'import yaml, grafana_foundation_sdk' 2>/dev/null || python_path="$PWD/.devbin/py"
# the package-dir mapping of pyproject.toml (ranksight.dashboards = dashboards/ ...) as an overlay
ov=/tmp/rs-scale-overlay
rm -rf $ov && mkdir -p $ov/ranksight
# every module and subpackage of ranksight/ (tools/, triage/, report/ ...)
for f in ranksight/*; do
  case ${f##*/} in __pycache__|*.egg-info) continue ;; esac
  ln -s "$PWD/$f" $ov/ranksight/
done
for pkg in dashboards alerts exporter; do ln -s "$PWD/$pkg" $ov/ranksight/$pkg; done
export PYTHONPATH="$ov${python_path:+:$python_path}" PYTHONDONTWRITEBYTECODE=1
nproc; free -g | head -2; df -h /dev/shm /tmp | tail -2
/tmp/rsbin/prometheus --version 2>&1 | head -1
# from /tmp: `python -m` puts the working directory first on sys.path, which would shadow the overlay
# the baseline group every minute (bench/scale/device-config.yml) unless the arguments name a config
config=(--config "$PWD/bench/scale/device-config.yml")
for a in "$@"; do [[ $a == --config || $a == --config=* ]] && config=(); done
(cd /tmp && $PY -m ranksight bench scale --prometheus /tmp/rsbin/prometheus --promtool /tmp/rsbin/promtool \
  --workdir /tmp --json --partial "$OUT/scale-partial.json" "${config[@]}" "$@") > "$OUT/scale.json" 2> >(tee "$OUT/scale.log" | grep -v ' scale: query ' >&2)
rc=$?
(cd /tmp && $PY - "$OUT/scale.json") <<'EOF' || true
import json, sys
r = json.load(open(sys.argv[1]))
from ranksight.tools.bench import load
load("scale")
import importlib
# the VictoriaMetrics layout's result has its own report (bench/scale/vm.py)
mod = importlib.import_module("bench.scale.vm" if r.get("engine") == "victoriametrics" else "bench.scale.cli")
print(mod.report(r))
EOF
exit $rc
