#!/usr/bin/env bash
# test/fuzz/have_engine.sh - whether this machine can build the fuzz targets: clang++ (FUZZ_CXX)
# linking a libFuzzer entry point with AddressSanitizer and UBSan. Exit 0 if so; otherwise prints
# why not (for the skip line of test/run_all.sh) and exits 1. tools/install_deps.sh installs
# what it needs (clang, libclang-rt-dev).
set -uo pipefail
cxx=${FUZZ_CXX:-clang++}
command -v "$cxx" >/dev/null || { echo "no $cxx (Debian: clang)"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' \
  > "$tmp/probe.cpp"
"$cxx" -fsanitize=fuzzer,address,undefined "$tmp/probe.cpp" -o "$tmp/probe" 2> "$tmp/err" ||
  { echo "$cxx cannot link libFuzzer with the sanitizers (Debian: libclang-rt-dev): $(head -c 200 "$tmp/err")"; exit 1; }
exit 0
