#!/usr/bin/env bash
# Set up the pinned CPU profile in .venv: real SGLang 0.5.22 (installed without its
# dependency tree; see README "Why not `pip install sglang`"), torch 2.14.1, the light
# dependencies SGLang's imports need, and this project (editable).  SGLang 0.5.23 goes
# into a second target, .deps/sglang-0.5.23, for the tests that compare both releases.
# Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VENV:-.venv}
stamp="$VENV/.sglang-warmup-setup"
want=$(cat requirements/cpu-sglang-0.5.22.txt pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "setup: $VENV is up to date"
  exit 0
fi
# pip, minus the notes about this machine's optional local package indexes that do not exist.
pip() {
  "$VENV/bin/python" -m pip "$@" 2>&1 | { grep -v "^WARNING: Location '.*' is ignored" || true; }
  return "${PIPESTATUS[0]}"
}
echo "setup: [1/4] virtual environment $VENV"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip install -q --upgrade pip
echo "setup: [2/4] pinned dependencies (torch 2.14.1 CPU profile; takes a few minutes the first time)"
pip install -q -r requirements/cpu-sglang-0.5.22.txt
echo "setup: [3/4] sglang 0.5.22 (no deps) and sglang 0.5.23 (no deps, second target)"
pip install -q --no-deps sglang==0.5.22
# 0.5.23 imports tvm_ffi at module level (kernels/ops/communication/all_reduce.py), which
# 0.5.22 imports lazily; its own pin goes into the same target so both releases share .venv.
pip install -q --no-deps --upgrade --target .deps/sglang-0.5.23 \
  sglang==0.5.23 apache-tvm-ffi==0.1.11
echo "setup: [4/4] sglang-warmup (editable)"
pip install -q --no-deps -e .
"$VENV/bin/python" -c "import sglang.srt.server_args, warmup; print('setup: ok, sglang', __import__('sglang').__version__)"
echo "$want" > "$stamp"
