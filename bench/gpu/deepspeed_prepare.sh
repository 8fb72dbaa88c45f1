#!/usr/bin/env bash
# Here, once, before tests/gpu/test_gpu_deepspeed.py runs on the GPU machine (torch + CUDA there,
# no network, no deepspeed): copies this venv's deepspeed (installed with DS_BUILD_OPS=0: pure
# Python, its ops are built only when used, and the GPU checks use none) and the pure-Python
# packages it imports into .devbin/py-deepspeed/, and pydantic with its compiled core into
# .devbin/py-deepspeed-cp311/ (this venv's CPython 3.11 build) and -cp312/ (the GPU machine's CPython,
# a wheel from the package index). git ignores .devbin; the device call carries it
# (carry=[".devbin"]; the working tree limit is 64 MiB). The GPU scripts put the first folder on
# the subprocesses' PYTHONPATH when `import deepspeed` fails there, and the running CPython's
# folder where it has no pydantic of its own (bench/gpu/gpu_workload.py: with_deepspeed).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
pure=.devbin/py-deepspeed
core=.devbin/py-deepspeed-cp311
rm -rf "$pure" "$core" && mkdir -p "$pure" "$core"
where() { $PY -c "import importlib.util as u; print(list(u.find_spec(\"$1\").submodule_search_locations)[0])"; }
for mod in deepspeed hjson einops cpuinfo msgpack; do cp -r "$(where $mod)" "$pure/"; done
# deepspeed's metadata too: Accelerate (the HF Trainer's deepspeed=) takes deepspeed as installed
# only where importlib.metadata finds its distribution
cp -r "$($PY -c 'import importlib.metadata as m; print(m.distribution("deepspeed")._path)')" "$pure/"
for mod in pydantic pydantic_core annotated_types typing_inspection; do cp -r "$(where $mod)" "$core/"; done
# the GPU machine's CPython 3.12: the same pydantic with pydantic_core's cp312 wheel from the package index
core12=.devbin/py-deepspeed-cp312
rm -rf "$core12" && mkdir -p "$core12"
for mod in pydantic annotated_types typing_inspection; do cp -r "$(where $mod)" "$core12/"; done
ver=$($PY -c "import pydantic_core; print(pydantic_core.__version__)")
tmp=$(mktemp -d)
$PY -m pip download -q "pydantic_core==$ver" --no-deps --only-binary :all: --python-version 3.12 \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d "$tmp"
$PY -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" "$tmp"/pydantic_core-*.whl "$core12"
rm -rf "$tmp" "$core12"/*.dist-info
find .devbin/py-deepspeed* -name __pycache__ -prune -exec rm -rf {} +
exclude="$(git rev-parse --git-common-dir)/info/exclude"
grep -qx '/.devbin/' "$exclude" 2>/dev/null || echo '/.devbin/' >> "$exclude"
du -sh "$pure" "$core" "$core12"
