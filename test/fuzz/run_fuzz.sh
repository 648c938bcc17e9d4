#!/usr/bin/env bash
# test/fuzz/run_fuzz.sh - `make fuzz`: each target named on the command line for FUZZ_SECONDS
# (default 60), in an AddressSanitizer + UndefinedBehaviorSanitizer build (test/fuzz/fuzz.mk).
# New interesting inputs go to $BUILD/fuzz/corpus/<target> (the saved corpus test/fuzz/corpus/
# <target> is read, not written); a crash, a sanitizer report, a hang (-timeout) or an
# allocation past -rss_limit_mb / -malloc_limit_mb stops the target, keeps the input as
# $BUILD/fuzz/crashes/<target>-..., and makes the whole run fail. One summary line per target.
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
SECONDS_EACH=${FUZZ_SECONDS:-60}
failed=()
mkdir -p "$BUILD/fuzz/crashes"
for t in "$@"; do
  mkdir -p "$BUILD/fuzz/corpus/$t"
  log="$BUILD/fuzz/$t.log"
  # -detect_leaks=0: the readers stop the program on bad input (their contract); the targets
  # turn that into an exception, which leaves what a stopping program would not free.
  # checkpoint_index: HDF5 (a library, not instrumented) asks malloc for sizes it reads from the
  # damaged file; in a normal run malloc says no and HDF5 reports an error, so here too. And its
  # own memory errors on damaged files are its bugs, not ours: suppressed (hdf5.supp).
  asan=""
  [ "$t" = checkpoint_index ] && asan="allocator_may_return_null=1:suppressions=test/fuzz/hdf5.supp:detect_leaks=0"
  ASAN_OPTIONS=$asan "$BUILD/fuzz/fuzz_$t" "$BUILD/fuzz/corpus/$t" "test/fuzz/corpus/$t" \
    -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 \
    -detect_leaks=0 -print_final_stats=1 -artifact_prefix="$BUILD/fuzz/crashes/$t-" \
    > "$log" 2>&1
  rc=$?
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$')
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
  if [ $rc -eq 0 ]; then
    echo "fuzz $t: clean, ${runs:-?} inputs in ${SECONDS_EACH} s, $cov," \
         "corpus $(ls "$BUILD/fuzz/corpus/$t" | wc -l) new + $(ls "test/fuzz/corpus/$t" | wc -l) saved"
  else
    failed+=("$t")
    echo "fuzz $t: FAILED (status $rc) after ${runs:-?} inputs; see $log:"
    grep -E "ERROR|SUMMARY|runtime error|Test unit written" "$log" | head -5
  fi
done
[ ${#failed[@]} -eq 0 ] || { echo "fuzz: ${#failed[@]} target(s) failed: ${failed[*]}"; exit 1; }
