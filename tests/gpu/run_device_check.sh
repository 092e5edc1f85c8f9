#!/usr/bin/env bash
# The nccl backend's device check, in one go, on a machine with one GPU (about 6 minutes on an H200).
# Uses the Python that has CuPy + NCCL (on the lent H200: python3 with cupy-cuda13x 14 and nvidia-nccl-cu13);
# elsewhere install the extra first: pip install -e ".[dev,gpu]". Writes logs under ${OUT:-/tmp/p2pgen-gpu}.
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
LOGS=${OUT:-/tmp/p2pgen-gpu}
mkdir -p "$LOGS"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi -L 2>/dev/null || echo "no nvidia-smi: no NVIDIA driver on this machine"
$PY -c "import cupy, cupy.cuda.nccl as n; print('cupy', cupy.__version__, 'nccl', n.get_version())" 2>/dev/null \
    || echo "CuPy NCCL is not importable: every GPU check below skips, saying why"
$PY -m pytest -q -p no:cacheprovider -m gpu tests/gpu -rs 2>&1 | tee "$LOGS/gpu_tests.log"
tests=${PIPESTATUS[0]}
$PY -m p2pgen_lab.bench.gpu_check --json >"$LOGS/gpu_check.json"
check=$?
$PY -c "import json,sys; from p2pgen_lab.bench.gpu_check import _text; print(_text(json.load(open(sys.argv[1]))))" \
    "$LOGS/gpu_check.json" | tee "$LOGS/gpu_check.txt"
echo "gpu tests exit $tests, gpu_check exit $check"
exit $(( tests || check ))
