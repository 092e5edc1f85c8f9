#!/usr/bin/env bash
# Regenerate the tables (text + JSON) and figures of sims/README.md (a few minutes on one core).
# Costs are the measured ones of sims/recovery-measured.json (`p2pgen bench recovery --json`); RECOVERY=PATH
# takes another measurement, RECOVERY= (empty) the assumed figures of p2pgen_lab/simulator/costs.py.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
RECOVERY=${RECOVERY-sims/recovery-measured.json}
ARGS=(--runs 3 --duration 20000 --seed 0 ${RECOVERY:+--recovery-json "$RECOVERY"} "$@")
run() { "$PY" -c 'import sys; from p2pgen.cli import main; sys.exit(main(sys.argv[1:]))' sim "$@"; }
run detector "${ARGS[@]}" --plot sims/detector.png > sims/detector.txt
run detector "${ARGS[@]}" --json > sims/detector.json
run churn "${ARGS[@]}" --plot sims/churn.png > sims/churn.txt
run churn "${ARGS[@]}" --json > sims/churn.json
echo "wrote sims/detector.{txt,json,png} sims/churn.{txt,json,png}"
