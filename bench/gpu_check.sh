#!/usr/bin/env bash
# pilotrun's CUDA paths on one real GPU, in one bounded call (bench/gpu_check.py says what it runs).
#   bash bench/gpu_check.sh [--cpu] [--budget S]     writes $OUT (default ./gpu-check-out): report.md,
#   report.json, log.txt, the tests' output. Wheels a machine lacks (pydantic …) are installed from
#   $GPU_CHECK_WHL (default ../whl beside this checkout) into /tmp/site when that folder holds any.
set -u
export PYTHONUNBUFFERED=1
root=$(cd "$(dirname "$0")/.." && pwd)
export OUT=${OUT:-$root/gpu-check-out}
mkdir -p "$OUT"
PY=${PY:-python3}
whl=${GPU_CHECK_WHL:-$root/../whl}
if ls "$whl"/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$whl"/*.whl \
    || echo "gpu_check: installing the carried wheels failed"
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$root/src${PYTHONPATH:+:$PYTHONPATH}
[ -d "$root/../shared_data" ] && export PILOTRUN_SHARED_DATA=$(cd "$root/../shared_data" && pwd)
cd "$root"
timeout 440 "$PY" bench/gpu_check.py "$@" 2>&1 | tee "$OUT/log.txt"
