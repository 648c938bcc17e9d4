#!/usr/bin/env bash
# test/fuzz/run_corpus.sh - every saved input of every fuzz target (test/fuzz/corpus/<target>:
# the seeds and the inputs that once found a bug) run once through its target, with the
# sanitizers on: the part of `make test` that keeps the readers' fixes fixed. Seconds.
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
failed=()
mkdir -p "$BUILD/fuzz/crashes"
for dir in test/fuzz/corpus/*/; do
  t=$(basename "$dir")
  n=$(ls "$dir" | wc -l)
  asan=""
  [ "$t" = checkpoint_index ] && asan="allocator_may_return_null=1:suppressions=test/fuzz/hdf5.supp:detect_leaks=0"  # see run_fuzz.sh
  if ASAN_OPTIONS=$asan "$BUILD/fuzz/fuzz_$t" "$dir" -runs=0 -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 \
       -detect_leaks=0 -artifact_prefix="$BUILD/fuzz/crashes/$t-" > "$BUILD/fuzz/$t.corpus.log" 2>&1; then
    echo "fuzz corpus $t: $n input(s) clean"
  else
    failed+=("$t")
    echo "fuzz corpus $t: FAILED; see $BUILD/fuzz/$t.corpus.log"
    grep -E "ERROR|SUMMARY|runtime error" "$BUILD/fuzz/$t.corpus.log" | head -5
  fi
done
[ ${#failed[@]} -eq 0 ]
