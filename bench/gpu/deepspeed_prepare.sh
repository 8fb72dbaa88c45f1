#!/usr/bin/env bash
# Here, once, before tests/gpu/test_gpu_deepspeed.py runs on the GPU machine (torch + CUDA there,
# no network, no deepspeed): copies this venv's deepspeed (installed with DS_BUILD_OPS=0: pure
# Python, its ops are built only when used, and the GPU checks use none) and the pure-Python
# packages it imports into .devbin/py-deepspeed/, and pydantic's compiled core (this venv's
# CPython 3.11 build) into .devbin/py-deepspeed-cp311/. git ignores .devbin; the device call
# carries it (carry=[".devbin"]; the working tree limit is 64 MiB). The test puts the first folder
# on the subprocesses' PYTHONPATH when `import deepspeed` fails there, and the second only for a
# Python 3.11 that has no pydantic of its own.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
pure=.devbin/py-deepspeed
core=.devbin/py-deepspeed-cp311
rm -rf "$pure" "$core" && mkdir -p "$pure" "$core"
where() { $PY -c "import importlib.util as u; print(list(u.find_spec(\"$1\").submodule_search_locations)[0])"; }
for mod in deepspeed hjson einops cpuinfo msgpack; do cp -r "$(where $mod)" "$pure/"; done
for mod in pydantic pydantic_core annotated_types typing_inspection; do cp -r "$(where $mod)" "$core/"; done
find .devbin/py-deepspeed* -name __pycache__ -prune -exec rm -rf {} +
exclude="$(git rev-parse --git-common-dir)/info/exclude"
grep -qx '/.devbin/' "$exclude" 2>/dev/null || echo '/.devbin/' >> "$exclude"
du -sh "$pure" "$core"
