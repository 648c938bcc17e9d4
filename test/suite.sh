# test/suite.sh - sourced by test/run_all.sh and test/run_gpu.sh: run test groups by name, time
# them, count what they skip, and print one summary line; suite_finish exits 1 if any group
# failed.
#
#   source test/suite.sh
#   suite_options ARGS...      run NAME COMMAND...     skip NAME REASON     suite_finish SUITE_NAME
#
# SUITE_GROUPS="name1 name2": run only the groups named (the others are not counted).
# suite_options takes `--only PATTERN` (or `--only=PATTERN`) out of a driver's arguments and
# exports it as TEST_ONLY, which the shared check helpers read (test/README.md, "Running one
# check"); the other arguments are left in the array SUITE_ARGS.
#
# Skips are counted, never silent. A group skips some of its checks by printing a line that
# starts with "SKIP" (leading blanks allowed): "SKIP BPE id comparison: python3-regex is not
# installed". It skips entirely by exiting with status 77 (automake's convention) after such a
# line. Every skip is one entry of the summary: "28 passed, 2 skipped: tokenize: BPE id
# comparison: python3-regex is not installed; emu: no CUDA headers".
failed=()
skipped=()
passed=0
export PYTHONUNBUFFERED=1  # the group's lines in the order they happen, through the pipe below

suite_options() {
  SUITE_ARGS=()
  while [ $# -gt 0 ]; do
    case $1 in
      --only) export TEST_ONLY=${2:?--only needs a pattern}; shift 2 ;;
      --only=*) export TEST_ONLY=${1#--only=}; shift ;;
      *) SUITE_ARGS+=("$1"); shift ;;
    esac
  done
}

run() {
  local name=$1; shift
  if [ -n "${SUITE_GROUPS:-}" ] && [[ " $SUITE_GROUPS " != *" $name "* ]]; then return 0; fi
  local start=$SECONDS log rc line
  log=$(mktemp)
  echo "=== $name"
  "$@" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  while IFS= read -r line; do
    skipped+=("$name: $line")
  done < <(sed -nE 's/^[[:space:]]*SKIP(PED)?:?[[:space:]]*//p' "$log")
  rm -f "$log"
  if [ "$rc" -eq 77 ]; then
    echo "=== $name: SKIPPED ($((SECONDS - start)) s)"
  elif [ "$rc" -eq 0 ]; then
    passed=$((passed + 1))
    echo "=== $name: passed ($((SECONDS - start)) s)"
  else
    failed+=("$name")
    echo "=== $name: FAILED ($((SECONDS - start)) s)"
  fi
}

skip() {
  if [ -n "${SUITE_GROUPS:-}" ] && [[ " $SUITE_GROUPS " != *" $1 "* ]]; then return 0; fi
  echo "=== $1: SKIPPED: $2"
  skipped+=("$1: $2")
}

suite_finish() {
  local summary="$passed passed" joined
  if [ ${#skipped[@]} -gt 0 ]; then
    joined=$(printf '%s; ' "${skipped[@]}")
    summary="$summary, ${#skipped[@]} skipped: ${joined%; }"
  fi
  [ -n "${TEST_ONLY:-}" ] &&
    summary="$summary; only the checks naming \"$TEST_ONLY\" (each group's count above)"
  echo
  if [ ${#failed[@]} -eq 0 ]; then
    echo "$1: all test groups passed ($summary) in $SECONDS s"
  else
    echo "$1: ${#failed[@]} FAILED (${failed[*]}), $summary, $SECONDS s"
    exit 1
  fi
}
