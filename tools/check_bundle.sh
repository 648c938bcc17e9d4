#!/usr/bin/env bash
# tools/check_bundle.sh - proves that the bundle (tools/make_bundle.sh) needs none of this
# machine's OpenMPI, PMIx, HDF5, TOML++ or any other library it carries, without a GPU.
#
#   tools/check_bundle.sh [BUNDLE_DIR]      (default: bundle; needs root and unshare)
#
# In a private mount namespace (unshare -m: nothing outside this process tree changes), every file
# the bundle's lib/ carries is hidden at its system path (a bind mount of /dev/null, so it
# cannot be loaded), and so are OpenMPI's and PMIx's folders (plugins, help texts, /etc/openmpi),
# the hwloc and HDF5 plugin folders and mpirun/orterun/orted. Then, with `env -i` (no inherited
# LD_LIBRARY_PATH, OPAL_* or PATH beyond /usr/bin:/bin):
#   1. run.sh check: every library of every bundled program resolves, none to a hidden path;
#   2. LD_DEBUG=libs ./train_cpu: each library initialised comes from the bundle or is part of the
#      C/C++ runtime;
#   3. ./train_cpu trains 5 steps of a tiny model on one rank, and bin/mpirun -np 2 ./train_cpu
#      trains the same 5 steps with FSDP over 2 ranks (the bundled OpenMPI, its plugins, PMIx),
#      writing an HDF5 checkpoint (the bundled parallel HDF5); the losses agree within 1e-5.
# Exit status 1 on the first failed check.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=$(cd "${1:-bundle}" && pwd)
[ -x "$DEST/run.sh" ] || { echo "check_bundle: $DEST is not a bundle (make bundle)"; exit 1; }
WORK=$(mktemp -d /tmp/check_bundle.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

# A tiny experiment, prepared before anything is hidden (Python needs libz).
python3 "$DEST/bench/make_tokens.py" "$WORK/train_000.bin" --tokens 20000 --vocab 256 >/dev/null
cat > "$WORK/tiny.toml" <<EOF
[model]
n_layer = 2
n_head = 2
d_model = 64
seq_len = 32
vocab_size = 256
[data]
train = "$WORK/train_*.bin"
[train]
micro_batch = 4
steps = 5
lr = 1e-3
[log]
every = 1
EOF

# What to hide: every library file the bundle carries, found at its system location, and the
# folders and programs of the system's OpenMPI/PMIx/hwloc/HDF5.
hidden_files=()
for lib in "$DEST"/lib/*.so*; do
  name=$(basename "$lib")
  for dir in /usr/lib/x86_64-linux-gnu /lib/x86_64-linux-gnu /usr/lib /usr/local/lib; do
    [ -e "$dir/$name" ] && hidden_files+=("$(readlink -f "$dir/$name")")
  done
done
for prog in orterun orted mpirun mpiexec; do
  p=$(command -v $prog || true)
  [ -n "$p" ] && hidden_files+=("$(readlink -f "$p")")
done
hidden_dirs=()
for dir in /usr/lib/x86_64-linux-gnu/openmpi /usr/lib/x86_64-linux-gnu/pmix2 /etc/openmpi \
           /usr/share/openmpi /usr/lib/x86_64-linux-gnu/hwloc /usr/lib/x86_64-linux-gnu/hdf5; do
  [ -d "$dir" ] && hidden_dirs+=("$dir")
done
printf '%s\n' "${hidden_files[@]}" | sort -u > "$WORK/hide_files"
printf '%s\n' "${hidden_dirs[@]}" > "$WORK/hide_dirs"
echo "check_bundle: hiding $(wc -l < "$WORK/hide_files") library/program files and" \
     "${#hidden_dirs[@]} folders of this machine"

# The checks, run inside the namespace once everything is hidden.
cat > "$WORK/inside.sh" <<'EOF'
set -euo pipefail
DEST=$1 WORK=$2
while read -r f; do mount --bind /dev/null "$f"; done < "$WORK/hide_files"
while read -r d; do mount -t tmpfs -o ro,size=1k none "$d"; done < "$WORK/hide_dirs"
fail() { echo "check_bundle: FAIL: $*"; exit 1; }
clean() { env -i PATH=/usr/bin:/bin HOME="$WORK" OMP_NUM_THREADS=1 "$@"; }

echo "--- 1. run.sh check (ldd of every program with the system's copies hidden)"
clean "$DEST/run.sh" check > "$WORK/check.txt" || { cat "$WORK/check.txt"; fail "run.sh check"; }
RUNTIME='libc|libm|libmvec|libresolv|libdl|libpthread|librt|libutil|libnss_[a-z]*'
RUNTIME="$RUNTIME|ld-linux[-a-z0-9_]*"
RUNTIME="$RUNTIME|libstdc\+\+|libgcc_s|libgomp"
CUDA='libcudart|libcublas|libcublasLt|libcudnn|libnccl'
grep -E "MISSING|system" "$WORK/check.txt" | grep -vE " ($RUNTIME|$CUDA)[.-]" \
  && fail "a library above resolves outside the bundle or not at all"
echo "    $(grep -c bundle "$WORK/check.txt") library links resolve into the bundle; the rest are" \
     "the C/C++ runtime and CUDA"

echo "--- 2. LD_DEBUG=libs: where ./train_cpu's libraries come from"
# run.sh's environment, then env(1) turns LD_DEBUG on for the trainer alone (not for the shell).
clean "$DEST/run.sh" exec env LD_DEBUG=libs "$DEST/libexec/train_cpu" "$WORK/tiny.toml" \
  --check-config > /dev/null 2> "$WORK/ld_debug.txt" \
  || { tail -5 "$WORK/ld_debug.txt"; fail "train_cpu --check-config"; }
grep "calling init:" "$WORK/ld_debug.txt" | awk '{print $NF}' | sort -u > "$WORK/inits.txt"
outside=$(grep -v "^$DEST/" "$WORK/inits.txt" | grep -vE "/($RUNTIME)\.so" || true)
[ -z "$outside" ] || fail "loaded from outside the bundle: $outside"
echo "    $(grep -c "^$DEST/" "$WORK/inits.txt") libraries from the bundle," \
     "$(grep -vc "^$DEST/" "$WORK/inits.txt") from the C/C++ runtime (glibc, libstdc++, libgomp)"

echo "--- 3. training: one rank, then FSDP over 2 ranks through bin/mpirun, with a checkpoint"
clean "$DEST/train_cpu" "$WORK/tiny.toml" --log.metrics="$WORK/one.jsonl" > "$WORK/one.log" 2>&1 \
  || { tail -20 "$WORK/one.log"; fail "train_cpu, one rank"; }
clean "$DEST/bin/mpirun" -np 2 "$DEST/train_cpu" "$WORK/tiny.toml" --parallel.dp=2 \
  --parallel.fsdp=true --train.micro_batch=2 --log.metrics="$WORK/two.jsonl" \
  --checkpoint.dir="$WORK/ckpt" > "$WORK/two.log" 2>&1 \
  || { tail -30 "$WORK/two.log"; fail "bin/mpirun -np 2 train_cpu"; }
grep -q "2 rank(s)" "$WORK/two.log" || fail "the mpirun job did not run as 2 ranks"
losses() { grep -o '"loss":[^,]*' "$1" | cut -d: -f2; }
paste <(losses "$WORK/one.jsonl") <(losses "$WORK/two.jsonl") | awk '
  { n++; r = ($1 - $2) / $1; if (r < 0) r = -r; if (r > worst) worst = r }
  END { printf "    %d steps, losses of 2 ranks vs 1 within %.1e (tol 1e-5)\n", n, worst;
        exit !(n == 5 && worst < 1e-5) }' || fail "losses differ"
[ -n "$(find "$WORK/ckpt" -name '*.h5' 2>/dev/null | head -1)" ] \
  || fail "no HDF5 checkpoint written under $WORK/ckpt"
echo "    HDF5 checkpoint: $(cd "$WORK/ckpt" && find . -name '*.h5' | head -3 | tr '\n' ' ')"
echo "check_bundle: all checks passed ($DEST, $(du -sh "$DEST" | cut -f1))"
EOF
unshare -m --propagation private bash "$WORK/inside.sh" "$DEST" "$WORK"
