#!/usr/bin/env bash
# `make test`: every test, in two phases (docs/testing.md, "Running the tests").
#   1. everything not marked `serial`, in parallel over $TEST_WORKERS pytest-xdist workers;
#   2. the `serial` tests alone, one at a time: they measure time, memory or latency, or stop
#      PostgreSQL, and would measure their neighbours under parallel load.
# Both phases always run; the exit code is the first failing phase's. Arguments go to both
# phases (a path, -k, -x, ...); a phase that they leave without tests is skipped (exit 5).
set -uo pipefail
cd "$(dirname "$0")/.."

workers="${TEST_WORKERS:-4}"
# The API fuzz runs beside three other workers here: give its schemathesis run more than the
# 200 s it has alone (tests/fuzz/test_fuzz.py), unless told otherwise. Its SQLite run took
# 85-207 s alone and 255 s and 421 s (cut off) in two full runs on two cores: its stateful
# phase varies from 4 s to 245 s with how many scenarios error under load.
export BULLPEN_FUZZ_TIMEOUT_S="${BULLPEN_FUZZ_TIMEOUT_S:-900}"
rc=0
ran=0
phase() {
  uv run pytest "$@"
  local code=$?
  if [ "$code" -eq 5 ]; then return; fi # no test selected in this phase
  ran=1
  if [ "$code" -ne 0 ] && [ "$rc" -eq 0 ]; then rc=$code; fi
}

echo "== phase 1/2: tests not marked serial, $workers workers in parallel"
phase -n "$workers" --dist worksteal -m "not serial" "$@"
echo "== phase 2/2: tests marked serial, one at a time"
phase -p no:xdist -m serial "$@"
if [ "$ran" -eq 0 ]; then exit 5; fi
exit "$rc"
