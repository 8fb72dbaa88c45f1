#!/usr/bin/env bash
# Here (not on the GPU machine), once before a multi-GPU device call: copy the Prometheus binary
# (a static Go program, 50 MB; the GPU machines have none and no network) into .devbin/, which
# git ignores, so that the call can carry it (carry=[".devbin"]; the working tree limit is 64 MiB).
set -euo pipefail
cd "$(dirname "$0")/../.."
src=${1:-$(command -v prometheus || true)}
[[ -n "$src" && -x "$src" ]] || { echo "prepare.sh: no prometheus binary (apt-get install prometheus)" >&2; exit 2; }
mkdir -p .devbin
cp "$src" .devbin/prometheus
grep -qx '/.devbin/' .git/info/exclude 2>/dev/null || echo '/.devbin/' >> .git/info/exclude
du -sh .devbin
