#!/bin/bash
# The project's wheel for the GPU carry (.carry/wheel/), built from the committed tree (git
# archive HEAD), never from the checkout in place: pip builds a local directory in place, and a
# build/ left there packages modules that no longer exist.  Run from the repo root.
set -euo pipefail
PY=${PYTHON:-.venv/bin/python}
src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
git archive HEAD | tar -x -C "$src"
mkdir -p .carry/wheel
rm -f .carry/wheel/sglang_warmup-*.whl
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w .carry/wheel "$src"
ls -l .carry/wheel
