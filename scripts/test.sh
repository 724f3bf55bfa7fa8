#!/usr/bin/env bash
# The test command (README; .ci/run calls exactly this).  Sets up the pinned CPU profile,
# starts a loopback Redis and an OCI registry (Debian's docker-registry) for the shared-cache
# tests, installs Debian's Chromium for the HTML report tests (apt-get: root, or the tests that
# need a missing package are skipped) and runs pytest on every core.  No GPU needed.
# pytest's own exit code is ours: a run that collects nothing exits 5.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PYBIN=.venv/bin

# Debian packages for the tests that need a real service or browser.  Installing one needs root
# (apt-get); without root (and no password-less sudo) the script says so and the tests that need
# the package are skipped, as they are when it cannot be installed.
apt_updated=
install_deb() {  # PACKAGE COMMAND WHAT-IS-SKIPPED-WITHOUT-IT
  command -v "$2" >/dev/null 2>&1 && return 0
  local sudo=
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
      sudo=sudo
    else
      echo "test: $1 is not installed, and installing it needs root (apt-get install $1);" \
        "$3 will be skipped"
      return 0
    fi
  fi
  echo "test: installing $1 (Debian package, apt-get as root)"
  { [ -n "$apt_updated" ] || $sudo apt-get update -qq; } \
    && apt_updated=1 \
    && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$1" >/dev/null \
    || echo "test: $1 could not be installed; $3 will be skipped"
}
# Redis on loopback for cache_tools' push/pull tests (a real store, not a stand-in), Debian's
# registry (the distribution project's registry:2) for the OCI store's tests, and Debian's
# Chromium, headless, for the HTML report tests (the page as a user sees it).
install_deb redis-server redis-server "the Redis tests"
install_deb docker-registry docker-registry "the OCI registry tests"
install_deb chromium chromium "the HTML report's browser tests"
REDIS_PORT=${WARMUP_TEST_REDIS_PORT:-6391}
redis_dir=$(mktemp -d)
registry_dir=$(mktemp -d)
# pytest's tmp_path directories live here and go with the run, so the suite leaves nothing in
# /tmp (pytest's own default keeps the last three runs); WARMUP_TEST_KEEP_TMP=1 keeps them.
pytest_tmp=$(mktemp -d)
cleanup() {
  [ -n "${redis_pid:-}" ] && kill "$redis_pid" 2>/dev/null || true
  [ -n "${registry_pid:-}" ] && kill "$registry_pid" 2>/dev/null || true
  rm -rf "$redis_dir" "$registry_dir"
  if [ "${WARMUP_TEST_KEEP_TMP:-0}" = 1 ]; then
    echo "test: pytest's temporary directories kept in $pytest_tmp"
  else
    rm -rf "$pytest_tmp"
  fi
}
trap cleanup EXIT
if command -v redis-server >/dev/null 2>&1; then
  redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --dir "$redis_dir" --save '' \
    --appendonly no --daemonize no >"$redis_dir/log" 2>&1 &
  redis_pid=$!
  for _ in $(seq 50); do
    redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break
    sleep 0.1
  done
  export WARMUP_TEST_REDIS_URL="redis://127.0.0.1:$REDIS_PORT/0"
fi
# The OCI registry on loopback, plain HTTP (the tests' oci+http:// references), its storage in a
# temporary directory; the TLS and login variants are started by the tests themselves.
REGISTRY_PORT=${WARMUP_TEST_REGISTRY_PORT:-5391}
if command -v docker-registry >/dev/null 2>&1; then
  printf '%s\n' 'version: 0.1' 'log: {level: warn}' \
    "storage: {filesystem: {rootdirectory: $registry_dir/data}, delete: {enabled: true}}" \
    "http: {addr: 127.0.0.1:$REGISTRY_PORT}" >"$registry_dir/config.yml"
  docker-registry serve "$registry_dir/config.yml" >"$registry_dir/log" 2>&1 &
  registry_pid=$!
  for _ in $(seq 50); do
    "$PYBIN/python" -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$REGISTRY_PORT/v2/', timeout=1)" \
      >/dev/null 2>&1 && break
    sleep 0.1
  done
  export WARMUP_TEST_REGISTRY="127.0.0.1:$REGISTRY_PORT"
fi

# Bytecode caches are written (into the gitignored __pycache__ directories) even where the
# machine sets PYTHONDONTWRITEBYTECODE: the suite starts hundreds of Python processes that import
# the project, and each compiled it anew (0.14 s a process for the CLI's modules; 2-core CI:
# 124 s against 130-138 s for the whole run, cold caches at the start).
unset PYTHONDONTWRITEBYTECODE

# The linter and the type checker first (pyproject.toml, [tool.ruff] and [tool.mypy]; the rule
# set and why: docs/testing.md): a new finding fails the run before any test starts.  mypy
# keeps its cache in .mypy_cache (22 s cold on 2 cores, about 2 s warm).
echo "test: ruff check, mypy (strict for cache_tools)"
"$PYBIN/ruff" check --quiet .
"$PYBIN/mypy" --no-error-summary

# One pytest worker per core plus one (pytest-xdist; work stealing evens out the slow tests that
# start SGLang interpreters).  Many tests wait on a subprocess or a socket, and the extra worker
# runs in those waits: on 2 cores 99-102 s against 111 s with one per core.
# WARMUP_TEST_WORKERS=N sets the number; 0 runs in this process (for a debugger).  The
# operator's self-check (`doctor --json`) runs as a test: tests/warmup/observe/test_doctor.py.
# (nproc counts the CPUs this process may use; without the OpenMP variables, which it obeys.)
workers=${WARMUP_TEST_WORKERS:-$(( $(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc) + 1 ))}
"$PYBIN/python" -m pytest -n "$workers" --dist worksteal --basetemp "$pytest_tmp/pytest" "$@"
