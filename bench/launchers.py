"""bench/launchers.py - tokens/s of the same 2-rank run under mpirun and under srun, side by side.

A tiny GPT-2 on the fortunes data (configs/demo.toml with 2 layers, 64 wide, T = 32, micro-batch
4, dp = 2) trained for --steps steps by ./train_cpu under each launcher; the number is the run's
summary (tokens/s over the steps after the first). srun runs on a private single-node Slurm
(test/slurm_cluster.py) started twice: with Slurm's task/none (ranks unbound: both may run on
every core) and task/affinity (each rank bound to its cores). Every launcher's ranks choose their
OpenMP threads from their affinity masks (parallel/host_threads.h); the row "srun, unbound,
OMP_NUM_THREADS = cores" is what every rank ran before that rule (one thread per core of its
mask, twice as many threads as cores with 2 ranks).

    python3 bench/launchers.py [--steps 40] [--bin ./train_cpu] [--repeat 2]

Needs root, slurm-wlm and munge (make deps). Prints a Markdown table (docs/PERF.md has the
recorded one): the best of --repeat runs of each launcher, in turn, so that a neighbour's load
on a shared machine hits every row alike.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "test"))
from slurm_cluster import SlurmCluster  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = ["--model.n_layer=2", "--model.d_model=64", "--model.n_head=2", "--model.seq_len=32",
         "--train.micro_batch=4", "--parallel.dp=2", "--log.val_every=0",
         "--log.sample_every=0", "--log.every=10"]
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2"]


def tokens_per_s(cmd, env, metrics):
    if os.path.exists(metrics):
        os.remove(metrics)
    subprocess.run(cmd + [f"--log.metrics={metrics}"], check=True, stdout=subprocess.DEVNULL,
                   env=env, cwd=ROOT, timeout=1800)
    with open(metrics) as f:
        for line in f:
            rec = json.loads(line)
            if "summary" in rec:
                return rec["summary"]["tokens_per_s"]
    raise RuntimeError(f"no summary in {metrics}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--bin", default="./train_cpu")
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    train = [os.path.abspath(os.path.join(ROOT, args.bin)), "configs/demo.toml",
             f"--train.steps={args.steps}", *MODEL]
    cores = len(os.sched_getaffinity(0))
    bare = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        metrics = os.path.join(tmp, "m.jsonl")

        def measure(name, cmd, env):
            best = max(tokens_per_s(cmd + train, env, metrics) for _ in range(args.repeat))
            rows[name] = best
            print(f"{name}: {best:.0f} tokens/s", flush=True)

        measure("mpirun -np 2 (bound to cores)", MPIRUN, bare)
        measure("mpirun -np 2 --bind-to none", MPIRUN + ["--bind-to", "none"], bare)
        for plugin in ("task/none", "task/affinity"):
            with SlurmCluster(os.path.join(tmp, plugin.replace("/", "_")), plugin) as slurm:
                srun = ["srun", "-n", "2", "--mpi=pmix"]
                env = {k: v for k, v in slurm.env().items() if k != "OMP_NUM_THREADS"}
                how = "unbound" if plugin == "task/none" else "bound to cores"
                measure(f"srun -n 2 --mpi=pmix ({how}, {plugin})", srun, env)
                if plugin == "task/none":
                    measure(f"srun -n 2 --mpi=pmix (unbound), OMP_NUM_THREADS={cores} "
                            "(the old default)", srun, dict(env, OMP_NUM_THREADS=str(cores)))
    base = rows["mpirun -np 2 (bound to cores)"]
    print(f"\n{cores} cores, {args.steps} steps, best of {args.repeat}\n")
    print("| launcher | tokens/s | vs mpirun |")
    print("|---|---|---|")
    for name, v in rows.items():
        print(f"| {name} | {v:.0f} | {v / base:.2f} |")


if __name__ == "__main__":
    main()
