# test/suite.sh - sourced by test/run_all.sh and test/run_gpu.sh: run test groups by name, time
# them, count what they skip, and print one summary line; suite_finish exits 1 if any group
# failed.
#
#   source test/suite.sh
#   suite_options ARGS...      run NAME COMMAND...     run_alone NAME COMMAND...
#   skip NAME REASON           suite_finish SUITE_NAME
#
# SUITE_GROUPS="name1 name2": run only the groups named (the others are not counted).
# suite_options takes `--only PATTERN` (or `--only=PATTERN`) out of a driver's arguments and
# exports it as TEST_ONLY, which the shared check helpers read (test/README.md, "Running one
# check"); the other arguments are left in the array SUITE_ARGS.
#
# Groups side by side. SUITE_JOBS groups run at once (default 1; run_all.sh sets 2): most groups
# leave a core idle much of the time (a rank waiting for its peer yields the core, a Python
# driver waits on a trainer process), so two at a time finish the suite sooner on two cores.
# Each group writes to its own log, printed whole when the group ends, so the output still reads
# group by group (in the order they finish). `run_alone` is for the groups that measure
# wall-clock time (a watchdog's timeout, a straggler's delay, a refusal "within 3 s"): it waits
# for the running groups, runs by itself, and only then lets the next ones start. A group's time
# is its own wall-clock time; with SUITE_JOBS > 1 it shares the cores, so it reads longer than
# the group alone would take. Its CPU seconds (user + system of all its processes) do not depend
# on the other lane: they are what to cut when the suite runs long.
#
#   lane 1: |== emu-gpu ===========|== pipeline ==|== ... ==|           |== watchdog ==|
#   lane 2: |== emu-asan ==|== diloco ==|== zero ==|== ... ====|        (run_alone: one lane)
#
# Skips are counted, never silent. A group skips some of its checks by printing a line that
# starts with "SKIP" (leading blanks allowed): "SKIP BPE id comparison: python3-regex is not
# installed". It skips entirely by exiting with status 77 (automake's convention) after such a
# line. Every skip is one entry of the summary: "28 passed, 2 skipped: tokenize: BPE id
# comparison: python3-regex is not installed; emu: no CUDA headers".
failed=()
skipped=()
passed=0
export PYTHONUNBUFFERED=1  # the group's lines in the order they happen, into its log
SUITE_JOBS=${SUITE_JOBS:-1}
SUITE_LOGS=$(mktemp -d)
declare -A suite_running=()  # pid -> group name, of the groups running now

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

selected() {  # is group $1 among those asked for?
  [ -z "${SUITE_GROUPS:-}" ] || [[ " $SUITE_GROUPS " == *" $1 "* ]]
}

# One group, run in the background into its log: its exit status and seconds go to NAME.rc and
# NAME.secs beside the log.
start_group() {
  local name=$1; shift
  (
    start=$SECONDS
    "$@" > "$SUITE_LOGS/$name.log" 2>&1
    rc=$?
    echo $((SECONDS - start)) > "$SUITE_LOGS/$name.secs"
    cpu_seconds "$SUITE_LOGS/$name.cpu"
    echo $rc > "$SUITE_LOGS/$name.rc"
  ) &
  suite_running[$!]=$name
}

# The processor seconds (user + system) of this subshell's finished children, written to $1:
# the group's whole work, whatever the other lane was doing meanwhile (its wall time is not: it
# grows when the lanes share the cores). `times` prints the shell's own line, then the
# children's; it must run in this shell (in a pipe it would report a fresh subshell's nothing).
cpu_seconds() {
  times > "$1.times"
  awk 'NR == 2 { n = 0; for (i = 1; i <= 2; i++) { split($i, t, /[ms]/); n += t[1] * 60 + t[2] }
                 printf "%.0f\n", n }' "$1.times" > "$1"
}

# Print a finished group's log and its verdict, and count it.
report_group() {
  local name=$1 rc secs line
  rc=$(cat "$SUITE_LOGS/$name.rc" 2>/dev/null || echo 1)
  secs=$(cat "$SUITE_LOGS/$name.secs" 2>/dev/null || echo "?")
  secs="$secs s, CPU $(cat "$SUITE_LOGS/$name.cpu" 2>/dev/null || echo "?") s"
  echo "=== $name"
  cat "$SUITE_LOGS/$name.log"
  while IFS= read -r line; do
    skipped+=("$name: $line")
  done < <(sed -nE 's/^[[:space:]]*SKIP(PED)?:?[[:space:]]*//p' "$SUITE_LOGS/$name.log")
  if [ "$rc" -eq 77 ]; then
    echo "=== $name: SKIPPED ($secs)"
  elif [ "$rc" -eq 0 ]; then
    passed=$((passed + 1))
    echo "=== $name: passed ($secs)"
  else
    failed+=("$name")
    echo "=== $name: FAILED ($secs)"
  fi
}

# Wait until at most $1 groups are running, reporting each one that ends.
wait_for_groups() {
  local pid
  while [ ${#suite_running[@]} -gt "$1" ]; do
    wait -n -p pid "${!suite_running[@]}"
    [ -n "${pid:-}" ] || break
    report_group "${suite_running[$pid]}"
    unset "suite_running[$pid]"
  done
}

run() {
  selected "$1" || return 0
  wait_for_groups $((SUITE_JOBS - 1))
  start_group "$@"
}

run_alone() {
  selected "$1" || return 0
  wait_for_groups 0
  start_group "$@"
  wait_for_groups 0
}

skip() {
  selected "$1" || return 0
  echo "=== $1: SKIPPED: $2"
  skipped+=("$1: $2")
}

suite_finish() {
  local summary joined
  wait_for_groups 0
  summary="$passed passed"
  cpu_seconds "$SUITE_LOGS/suite.cpu"
  local took="$SECONDS s, CPU $(cat "$SUITE_LOGS/suite.cpu") s"
  rm -rf "$SUITE_LOGS"
  if [ ${#skipped[@]} -gt 0 ]; then
    joined=$(printf '%s; ' "${skipped[@]}")
    summary="$summary, ${#skipped[@]} skipped: ${joined%; }"
  fi
  [ -n "${TEST_ONLY:-}" ] &&
    summary="$summary; only the checks naming \"$TEST_ONLY\" (each group's count above)"
  echo
  if [ ${#failed[@]} -eq 0 ]; then
    echo "$1: all test groups passed ($summary) in $took"
  else
    echo "$1: ${#failed[@]} FAILED (${failed[*]}), $summary, $took"
    exit 1
  fi
}
