# Sourced by the GPU machine's scripts (from the repo root): makes this checkout importable as
# `ranksight` with PY (python3 by default): an editable install, else a PYTHONPATH overlay that
# maps ranksight.hooks -> hooks/, ranksight.exporter -> exporter/ etc. as pyproject.toml does.
PY=${PYTHON:-python3}
if ! $PY -c 'import ranksight.hooks, ranksight.exporter.agent' 2>/dev/null; then
  $PY -m pip install -q --no-deps --no-build-isolation --no-cache-dir -e . >/dev/null 2>&1 || true
fi
if ! $PY -c 'import ranksight.hooks, ranksight.exporter.agent' 2>/dev/null; then
  root=/tmp/rs-overlay-checkout
  rm -rf "$root"; mkdir -p "$root/ranksight"
  for f in ranksight/*; do ln -s "$PWD/$f" "$root/ranksight/"; done
  for sub in hooks exporter dashboards alerts; do ln -s "$PWD/$sub" "$root/ranksight/$sub"; done
  export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
fi
