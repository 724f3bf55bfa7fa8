#!/usr/bin/env bash
# scripts/bench_cache.py on another host: two of its CPUs (taskset, as on a 2-core machine),
# then all of them, into $OUT.  The seed entries come in .carry/seed (a copy of a directory made
# by `bench_cache.py --compile-seed`); no Triton is needed there.
#   run: bash scripts/bench_cache_device.sh   (carry: [".carry/seed"])
set -euo pipefail
OUT=${OUT:-/tmp/bench-out}
mkdir -p "$OUT"
PY=${PY:-python3}
seed=/dev/shm/bench-seed
rm -rf "$seed" && cp -r .carry/seed "$seed"
ops="pack,verify,restore"
if "$PY" -c "import zstandard" 2>/dev/null && command -v zstd >/dev/null; then
  ops="pack,pack zstd,verify,restore"
fi
echo "host: $(nproc) CPUs, $("$PY" --version), tar $(tar --version | head -1)"
taskset -c 0,1 "$PY" scripts/bench_cache.py --seed "$seed" --caches triton --ops "$ops" \
  --rounds 7 --workdir /dev/shm/bench-2cpu --json "$OUT/bench-cache-2cpu.json"
"$PY" scripts/bench_cache.py --seed "$seed" --caches triton --ops "$ops" --rounds 7 \
  --workdir /dev/shm/bench-all --json "$OUT/bench-cache-allcpu.json"
