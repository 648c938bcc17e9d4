#!/usr/bin/env bash
# tools/make_bundle.sh - `make bundle`: a relocatable folder (bundle/) that runs the GPU tests and
# benchmarks on a GPU node with only the NVIDIA driver and CUDA libraries: no MPI, HDF5, TOML++,
# compiler or network (docs/PERF.md "Offline bundle").
#
#   tools/make_bundle.sh            (BUILD=build, TRAIN=./train, TRAIN_CPU=./train_cpu,
#                                    BUNDLE_DIR=bundle)
#
# Layout:
#   run.sh                 the entry point (tools/bundle_run.sh): environment, tests, benchmarks
#   train, train_cpu, build/{test_gpu,test_model_grads,cuda_test_model_grads,cuda_test_fp8_sites,
#                            bench_kernels},
#   bin/mpirun             wrappers that run the real program through run.sh's environment
#   libexec/               the real programs (debug info stripped)
#   lib/                   every shared library they, mpirun/orted and the MPI plugins need, except
#                          the C/C++ runtime and the CUDA libraries (found with ldd)
#   lib/fallback/          libgomp and the libcudnn.so.9 loader stub, used only when the node
#                          lacks them
#   mpi/                   OpenMPI's prefix: bin/{orterun,orted}, lib/openmpi3 (MCA plugins,
#                          without the InfiniBand/UCX/libfabric/PSM transports, whose libraries a
#                          single node does not need), share/openmpi (help texts), etc (MCA
#                          parameters); pmix/ (PMIx plugins and help texts); hwloc/ (empty)
#   test/, bench/, configs/, docs/PERF.md   the scripts the tests and benchmarks run
# tools/check_bundle.sh checks the result with this machine's copies of those libraries hidden.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
TRAIN=${TRAIN:-./train}
TRAIN_CPU=${TRAIN_CPU:-./train_cpu}
DEST=${BUNDLE_DIR:-bundle}

PROGRAMS=("$TRAIN" "$TRAIN_CPU" "$BUILD/test_gpu" "$BUILD/test_model_grads"
          "$BUILD/cuda_test_model_grads" "$BUILD/cuda_test_fp8_sites" "$BUILD/bench_kernels")
# Libraries the node provides (C/C++ runtime, driver, CUDA) - never copied into lib/.
GLIBC='linux-vdso|ld-linux|libc\.|libm\.|libmvec|libpthread|libdl\.|librt\.|libresolv|libutil'
GLIBC="$GLIBC|libnsl|libanl"
CXX_RUNTIME='libstdc\+\+|libgcc_s|libgomp'
CUDA='libcuda\.|libcudart|libcublas|libcudnn|libnccl|libnvidia|libnvrtc|libnvJitLink'
SYSTEM_LIBS="^($GLIBC|$CXX_RUNTIME|$CUDA)"
# MCA plugins for network fabrics a single node does not use; their libraries stay behind.
FABRIC_LIBS='libfabric|libuc[mpst]\.|libpsm|libibverbs|librdmacm'

die() { echo "make_bundle: $*" >&2; exit 1; }

for p in "${PROGRAMS[@]}"; do
  [ -x "$p" ] || die "$p is missing: build it first (make bundle builds everything)"
done
command -v ompi_info >/dev/null || die "ompi_info not found: OpenMPI is needed to bundle it"
mpi_path() { ompi_info --parsable --path "$1" | cut -d: -f3; }
MPI_PLUGINS=$(mpi_path pkglibdir)
MPI_HELP=$(mpi_path pkgdatadir)
MPI_ETC=$(mpi_path sysconfdir)
ORTERUN=$(readlink -f "$(command -v orterun || command -v mpirun)")
ORTED=$(readlink -f "$(command -v orted)")

if [ -e "$DEST" ]; then
  [ -f "$DEST/MANIFEST" ] || die "$DEST exists but is not a bundle (no MANIFEST): not removing it"
  rm -rf "$DEST"
fi
mkdir -p "$DEST"/{libexec,lib/fallback,bin,build,test,bench,configs,docs} \
         "$DEST"/mpi/{bin,lib/openmpi3,share/openmpi,etc,hwloc,pmix/lib/pmix,pmix/share/pmix}

# --- programs and their wrappers --------------------------------------------------------------
wrapper() {  # wrapper PATH_IN_BUNDLE TARGET_IN_BUNDLE: PATH runs TARGET through run.sh
  local up=.
  [ "$(dirname "$1")" != . ] && up=..  # wrappers live at most one folder down
  cat > "$DEST/$1" <<EOF
#!/bin/sh
# Bundle wrapper: runs $2 with the bundle's libraries and OpenMPI (see run.sh).
exec "\$(dirname "\$(readlink -f "\$0")")/$up/run.sh" exec $2 "\$@"
EOF
  chmod +x "$DEST/$1"
}
for p in "${PROGRAMS[@]}"; do
  name=$(basename "$p")
  cp "$p" "$DEST/libexec/$name"
  strip --strip-debug "$DEST/libexec/$name"
  case $name in
    train|train_cpu) wrapper "$name" "libexec/$name" ;;
    *) wrapper "build/$name" "libexec/$name" ;;
  esac
done
cp tools/bundle_run.sh "$DEST/run.sh"
chmod +x "$DEST/run.sh"

# --- OpenMPI, PMIx ------------------------------------------------------------------------------
cp "$ORTERUN" "$DEST/mpi/bin/orterun"
cp "$ORTED" "$DEST/mpi/bin/orted"
for name in mpirun mpiexec orterun; do wrapper "bin/$name" mpi/bin/orterun; done
skipped_plugins=()
for so in "$MPI_PLUGINS"/*.so; do
  if ldd "$so" | grep -qE "$FABRIC_LIBS"; then
    skipped_plugins+=("$(basename "$so" .so)")
  else
    cp "$so" "$DEST/mpi/lib/openmpi3/"
  fi
done
cp "$MPI_HELP"/*.txt "$DEST/mpi/share/openmpi/"
[ -d "$MPI_HELP/amca-param-sets" ] && cp -r "$MPI_HELP/amca-param-sets" "$DEST/mpi/share/openmpi/"
cp "$MPI_ETC"/openmpi-mca-params.conf "$MPI_ETC"/openmpi-default-hostfile "$DEST/mpi/etc/" \
  2>/dev/null || true
echo "hwloc plugins: none; run.sh points HWLOC_PLUGINS_PATH here" > "$DEST/mpi/hwloc/README"
PMIX_LIB=$(ldd "$MPI_PLUGINS"/mca_pmix_*.so 2>/dev/null | awk '/libpmix/{print $3; exit}')
if [ -n "$PMIX_LIB" ]; then  # external PMIx (Debian): its plugins and help texts
  PMIX_ROOT=$(dirname "$(dirname "$(readlink -f "$PMIX_LIB")")")
  [ -d "$PMIX_ROOT/lib/pmix" ] && cp "$PMIX_ROOT"/lib/pmix/*.so "$DEST/mpi/pmix/lib/pmix/"
  [ -d "$PMIX_ROOT/share/pmix" ] && cp "$PMIX_ROOT"/share/pmix/*.txt "$DEST/mpi/pmix/share/pmix/"
fi

# --- shared libraries: the closure of everything above under ldd ------------------------------
copy_dependencies() {  # copy_dependencies FILE... : non-system libraries into lib/
  local f name path
  for f in "$@"; do
    while read -r name path; do
      [ -n "$path" ] || continue
      [[ $path == "not" ]] && die "$f needs $name, which ldd cannot find here"
      [[ $name =~ $SYSTEM_LIBS ]] && continue
      [ -e "$DEST/lib/$name" ] || cp -L "$path" "$DEST/lib/$name"
    done < <(ldd "$f" | awk '/=>/{print $1, $3}')
  done
}
shopt -s nullglob
copy_dependencies "$DEST"/libexec/* "$DEST"/mpi/bin/* "$DEST"/mpi/lib/openmpi3/*.so \
  "$DEST"/mpi/pmix/lib/pmix/*.so
shopt -u nullglob
for f in libgomp.so.1 libcudnn.so.9; do  # only used where the node lacks them (run.sh)
  path=$(ldd "$DEST/libexec/train" | awk -v n="$f" '$1 == n {print $3}')
  [ -n "$path" ] && [ -e "$path" ] && cp -L "$path" "$DEST/lib/fallback/$f"
done

# --- scripts, configs, docs -------------------------------------------------------------------
cp test/run_gpu.sh test/suite.sh test/test_gpu_train.py test/trainer.py test/checks.py \
   test/gpt2_reference.py "$DEST/test/"
cp bench/run_all.sh bench/e2e.py bench/make_tokens.py "$DEST/bench/"
cp configs/*.toml "$DEST/configs/"
[ -f docs/PERF.md ] && cp docs/PERF.md "$DEST/docs/"

{
  echo "bundle made $(date -u +%Y-%m-%dT%H:%MZ) on $(hostname) from $(pwd)"
  echo "programs: ${PROGRAMS[*]}"
  echo "OpenMPI $(ompi_info --parsable | awk -F: '/^ompi:version:full:/{print $4}')" \
       "from $ORTERUN, plugins $MPI_PLUGINS"
  echo "MCA plugins left out (network fabrics): ${skipped_plugins[*]:-none}"
  echo "files:"
  (cd "$DEST" && find . -type f | sort | xargs du -k | awk '{printf "  %6d KiB %s\n", $1, $2}')
} > "$DEST/MANIFEST"
echo "make_bundle: $DEST ($(du -sh "$DEST" | cut -f1)): $(ls "$DEST/lib" | wc -l) libraries," \
     "$(ls "$DEST/mpi/lib/openmpi3" | wc -l) MPI plugins (${#skipped_plugins[@]} fabric plugins" \
     "left out); check it with tools/check_bundle.sh"
