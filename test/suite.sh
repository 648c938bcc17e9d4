# test/suite.sh - sourced by test/run_all.sh and test/run_gpu.sh: run test groups by name, time
# them, and print one summary line; suite_finish exits 1 if any group failed.
#
#   source test/suite.sh
#   run NAME COMMAND...        skip NAME REASON        suite_finish SUITE_NAME
failed=()
skipped=()
passed=0

run() {
  local name=$1; shift
  local start=$SECONDS
  echo "=== $name"
  if "$@"; then
    passed=$((passed + 1))
    echo "=== $name: passed ($((SECONDS - start)) s)"
  else
    failed+=("$name")
    echo "=== $name: FAILED ($((SECONDS - start)) s)"
  fi
}

skip() {
  echo "=== $1: SKIPPED: $2"
  skipped+=("$1")
}

suite_finish() {
  local summary="$passed passed"
  [ ${#skipped[@]} -gt 0 ] && summary="$summary, SKIPPED: ${skipped[*]}"
  echo
  if [ ${#failed[@]} -eq 0 ]; then
    echo "$1: all test groups passed ($summary) in $SECONDS s"
  else
    echo "$1: ${#failed[@]} FAILED (${failed[*]}), $summary, $SECONDS s"
    exit 1
  fi
}
