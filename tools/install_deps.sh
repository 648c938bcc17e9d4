#!/usr/bin/env bash
# tools/install_deps.sh - installs the Debian packages the trainer and its tests need; does
# nothing when they are all present. Called by `make run` and `make test`.
#
# Build: g++, make, pkg-config, OpenMPI, HDF5 (openmpi flavour), TOML++.
# Data:  fortunes (the bundled demo corpus), curl (fetches the GPT-2 BPE files; without it
#        the demo falls back to a byte-level tokenizer).
# Tests: Debian's python3 with torch, numpy, h5py and regex (reference implementations; without
#        regex test_tokenize skips its BPE id comparison), util-linux's unshare (test_zero's
#        small-tmpfs cases). Every group that skips something says so and the suite's summary
#        counts it (test/suite.sh): what it names is installed here, so CI skips only what
#        cannot run on it (the CUDA groups without the toolkit).
# Plots: python3-matplotlib (tools/plot.py, the demo's loss.png).
# Slurm: slurm-wlm (slurmctld, slurmd, srun, sbatch; its PMIx plugin pulls libpmix2, which
#        Debian's Open MPI uses too) and munge: the slurm group starts a private single-node
#        Slurm (test/slurm_cluster.py), bench/launchers.py times srun against mpirun.
# Fuzz:  clang with libFuzzer and the sanitizers' runtimes (libclang-rt-dev): `make fuzz` and
#        the saved-corpus group of `make test` (test/fuzz/README.md).
# The CUDA toolkit (nvcc, cuBLAS, cuDNN, NCCL) is not a Debian package here; without it only
# ./train_cpu is built.
set -euo pipefail
packages=(g++ make pkg-config openmpi-bin libopenmpi-dev libhdf5-openmpi-dev hdf5-tools
          libtomlplusplus-dev fortunes fortunes-min curl ca-certificates
          python3 python3-torch python3-numpy python3-h5py python3-regex python3-matplotlib
          util-linux clang libclang-rt-dev slurm-wlm munge)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "install_deps: installing ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install_deps: need root or sudo to install ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
