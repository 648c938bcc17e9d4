#!/usr/bin/env bash
# run.sh - the one entry point of the offline bundle (made by tools/make_bundle.sh from
# tools/bundle_run.sh; docs/PERF.md). On a GPU node that has only the NVIDIA driver and the CUDA
# libraries - no MPI, HDF5 or TOML++, no compiler, no network - it runs the GPU tests and the
# benchmarks with everything else taken from this folder:
#
#   ./run.sh                    the GPU tests, then the benchmarks; exit 1 if a test failed
#   ./run.sh test [GROUP...]    test/run_gpu.sh (groups: kernels, train)
#   ./run.sh bench [PART...]    bench/run_all.sh (parts: kernels, e2e, e2e-124m, e2e-1558m)
#   ./run.sh check              which file every library of every program resolves to
#   ./run.sh exec PROG [ARGS]   PROG (a path inside the bundle, or a command) in this environment
#
# The programs (./train, ./train_cpu, build/*, bin/mpirun) are small wrappers that come back here
# through `exec`, so they also work when called directly, e.g. under another launcher.
#
# Environment it sets:
# - LD_LIBRARY_PATH (only for the bundle's programs, never for Python): lib/ (OpenMPI, PMIx,
#   HDF5, TOML++ and their dependencies), then any directory holding a CUDA library the programs
#   need that the default search path lacks (e.g. cuDNN/NCCL inside a PyTorch installation), then
#   lib/fallback/ for a library found nowhere else (libgomp, the libcudnn.so.9 loader stub).
# - OPAL_PREFIX and OPAL_*DIR: OpenMPI relocated into mpi/ (plugins mpi/lib/openmpi3, help texts
#   mpi/share/openmpi, MCA parameters mpi/etc); PMIX_PREFIX and the PMIx plugin path likewise;
#   HWLOC_PLUGINS_PATH to an empty folder so that a foreign hwloc plugin is never loaded.
# - OMPI_ALLOW_RUN_AS_ROOT(+_CONFIRM), oversubscription allowed; PATH gets bin/ (mpirun) first.
set -euo pipefail
B=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# ":dir" for each library the trainer needs that is not found with lib/ alone.
extra_library_dirs() {
  local lib found dirs=""
  for lib in $(LD_LIBRARY_PATH="$B/lib" ldd "$B/libexec/train" 2>/dev/null |
               awk '/not found/{print $1}'); do
    found=$(find /usr/local /opt /usr/lib /usr/lib64 -name "$lib" -print -quit 2>/dev/null || true)
    if [ -n "$found" ]; then
      dirs="$dirs:$(dirname "$found")"
    elif [ -e "$B/lib/fallback/$lib" ]; then
      dirs="$dirs:$B/lib/fallback"
    fi
  done
  echo "$dirs"
}

bundle_env() {
  [ "${BUNDLE_ROOT:-}" = "$B" ] && return 0  # already set (a wrapper called from inside)
  export BUNDLE_ROOT=$B
  local m=$B/mpi
  export OPAL_PREFIX=$m OPAL_EXEC_PREFIX=$m OPAL_BINDIR=$m/bin OPAL_LIBDIR=$B/lib \
         OPAL_PKGLIBDIR=$m/lib/openmpi3 OPAL_DATAROOTDIR=$m/share OPAL_DATADIR=$m/share \
         OPAL_PKGDATADIR=$m/share/openmpi OPAL_SYSCONFDIR=$m/etc
  export PMIX_PREFIX=$m/pmix PMIX_MCA_mca_base_component_path=$m/pmix/lib/pmix
  export HWLOC_PLUGINS_PATH=$m/hwloc
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  export OMPI_MCA_rmaps_base_oversubscribe=1
  export PATH="$B/bin:$PATH"
  BUNDLE_LIBRARY_PATH="$B/lib$(extra_library_dirs)"
  export BUNDLE_LIBRARY_PATH
}

# Every program's libraries: in the bundle, elsewhere (the system, CUDA), or missing.
check_libraries() {
  local prog missing=0
  for prog in "$B"/libexec/* "$B/mpi/bin/orterun"; do
    echo "== ${prog#$B/}"
    LD_LIBRARY_PATH="$BUNDLE_LIBRARY_PATH" ldd "$prog" | awk -v b="$B/" '
      /=>/ { where = index($3, b) == 1 ? "bundle" : ($3 == "not" ? "MISSING" : "system");
             printf "   %-8s %-32s %s\n", where, $1, $3 }'
    if LD_LIBRARY_PATH="$BUNDLE_LIBRARY_PATH" ldd "$prog" | grep -q "not found"; then
      missing=1
    fi
  done
  [ $missing -eq 0 ] && echo "run.sh check: every library resolves" && return 0
  echo "run.sh check: MISSING libraries above (CUDA ones come from the node: install the CUDA"
  echo "  toolkit libraries, or point LD_LIBRARY_PATH at a folder that has them)"
  return 1
}

bundle_env
cmd=${1:-all}
[ $# -gt 0 ] && shift
case $cmd in
  exec)
    prog=$1; shift
    [ -e "$B/$prog" ] && prog="$B/$prog"
    export LD_LIBRARY_PATH="$BUNDLE_LIBRARY_PATH${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    exec "$prog" "$@" ;;
  test) cd "$B" && BUILD=build TRAIN=./train TRAIN_CPU=./train_cpu test/run_gpu.sh "$@" ;;
  bench) cd "$B" && BUILD=build TRAIN=./train bench/run_all.sh "$@" ;;
  check) check_libraries ;;
  all)
    cd "$B"
    status=0
    BUILD=build TRAIN=./train TRAIN_CPU=./train_cpu test/run_gpu.sh || status=1
    BUILD=build TRAIN=./train bench/run_all.sh || status=1
    exit $status ;;
  *) echo "usage: $0 [test|bench|check|exec PROG ...] (see the top of this file)"; exit 2 ;;
esac
