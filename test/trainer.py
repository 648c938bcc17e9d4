"""test/trainer.py - helpers shared by the trainer-level tests: write a tiny experiment (llm.c
model file, token shards, config), run ./train_cpu (optionally under mpirun) and read back its
JSONL metrics."""
import glob
import json
import os
import signal
import subprocess
import sys
import time
import zlib

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2_reference as ref  # noqa: E402
from checks import Checks  # noqa: E402,F401  (the tests import it from here)

TRAIN_CPU = os.environ.get("TRAIN_CPU", "./train_cpu")
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none"]


def learnable_tokens(rng, n, V):
    """A token stream with structure (each token mostly determined by the previous one), so
    that losses fall quickly and a wrong update shows in them."""
    tokens = np.empty(n, dtype=np.int64)
    tokens[0] = rng.integers(0, V)
    noise = rng.integers(0, 3, size=n)
    for i in range(1, n):
        tokens[i] = (tokens[i - 1] * 7 + 3 + noise[i]) % V
    return tokens


def make_experiment(tmp, rng, L=2, NH=3, C=36, T=16, V=101, n_tokens=4000, shard_version=1,
                    model=True):
    """Random llm.c model file (if model) and one train + one val shard in tmp."""
    if model:
        params = ref.random_params(L, C, T, V, rng)
        ref.write_model(os.path.join(tmp, "model.bin"), params, L, NH, C, T, V)
    tokens = learnable_tokens(rng, n_tokens, V)
    ref.write_shard(os.path.join(tmp, "train_000.bin"), tokens, shard_version)
    ref.write_shard(os.path.join(tmp, "val_000.bin"), learnable_tokens(rng, 2000, V),
                    shard_version)
    return tokens


def write_config(tmp, name, sections):
    """sections: {"model": {...}, ...}; strings are quoted, bools lower-case."""
    def value(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return json.dumps(v)
        return repr(v)
    lines = []
    for sec, kv in sections.items():
        lines.append(f"[{sec}]")
        lines += [f"{k} = {value(v)}" for k, v in kv.items()]
        lines.append("")
    path = os.path.join(tmp, name)
    with open(path, "w") as f:
        f.write("\n".join(lines))
    return path


def run(config, overrides=(), np_ranks=0, timeout=600, check=True, env=None, binary=None):
    """Runs the trainer (binary: TRAIN_CPU unless given); returns the CompletedProcess.
    np_ranks > 0 launches under mpirun."""
    cmd = [binary or TRAIN_CPU, config, *overrides]
    if np_ranks > 0:
        cmd = MPIRUN + ["-np", str(np_ranks)] + cmd
    full_env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    full_env.update(env or {})
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env)
    if check and r.returncode != 0:
        print(r.stdout[-3000:])
        print(r.stderr[-3000:])
        raise RuntimeError(f"trainer failed ({r.returncode}): {' '.join(cmd)}")
    return r


def read_metrics(path):
    """(step records, val records) from a JSONL metrics file."""
    steps, vals = [], []
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            if "step" in rec:  # not the run record, nor the end-of-run summary
                (vals if "val_loss" in rec else steps).append(rec)
    return steps, vals


def read_memory_peaks(path):
    """Every rank's device memory peak (the backend's allocator, ops::memory_peak), from the
    {"end": ...} record a run that trained to its end writes last; None without one."""
    peaks = None
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            if "end" in rec:
                peaks = rec["end"]["mem_peak_bytes"]
    return peaks


def read_run_info(path):
    """The {"run": ...} record a run writes first."""
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            if "run" in rec:
                return rec["run"]
    return None


def base_sections(tmp, steps, **train):
    sec = {
        "init": {"from": os.path.join(tmp, "model.bin")},
        "data": {"train": os.path.join(tmp, "train_*.bin"), "shuffle": False},
        "train": {"micro_batch": 2, "grad_accum": 1, "steps": steps, "lr": 1e-3,
                  "warmup_steps": 0, "lr_schedule": "constant", "weight_decay": 0.0,
                  "grad_clip": 0.0, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8},
        "log": {"every": 1, "metrics": os.path.join(tmp, "metrics.jsonl")},
    }
    sec["train"].update(train)
    return sec


def with_validation(sections, tmp, every, batches):
    """Validation on tmp's val_*.bin shards every `every` steps over `batches` batches."""
    sections["data"]["val"] = os.path.join(tmp, "val_*.bin")
    sections["log"].update({"val_every": every, "val_batches": batches})
    return sections


def seeded_rng(name, detail=""):
    """Fresh random inputs every run, reproducible: prints the seed (SEED=<n> reproduces it)."""
    seed = int(os.environ.get("SEED", np.random.SeedSequence().entropy % (2**32)))
    print(f"{name}: seed {seed} (SEED={seed} reproduces){detail}")
    return np.random.default_rng(seed)


def check_refused(checks, tmp, what, sections, np_ranks, words):
    """A config that must be refused before any work: non-zero exit, every word of `words` in
    the output, and no step line."""
    if not checks.wanted(f"refused: {what}"):
        return
    r = run(write_config(tmp, "bad.toml", sections), np_ranks=np_ranks, check=False, timeout=60)
    text = r.stdout + r.stderr
    ok = r.returncode != 0 and all(w in text for w in words) and "| loss" not in r.stdout
    checks.check(f"refused: {what}", ok,
                 next((ln for ln in text.splitlines() if "error" in ln), "no error line"))


def compare_runs(checks, what, got, ref, tol=1e-5):
    """got, ref: (step records, val records, sampled text, ...) of two runs that must agree:
    per-step losses and gradient norms and the last validation loss within tol relative, the
    same number of steps, and the same sampled text."""
    steps, vals, sample = got[:3]
    rsteps, rvals, rsample = ref[:3]
    loss = max_rel([s["loss"] for s in steps], [s["loss"] for s in rsteps])
    norm = max_rel([s["grad_norm"] for s in steps], [s["grad_norm"] for s in rsteps])
    val = max_rel([vals[-1]["val_loss"]], [rvals[-1]["val_loss"]])
    ok = len(steps) == len(rsteps) and max(loss, norm, val) < tol and sample == rsample
    if os.environ.get("COMPARE_RUNS_LOG"):  # measuring tolerances: every comparison's errors
        with open(os.environ["COMPARE_RUNS_LOG"], "a") as f:
            f.write(json.dumps({"test": checks.name, "what": what, "loss": loss, "norm": norm,
                                "val": val, "tol": tol}) + "\n")
    checks.check(f"{what}: losses, norms, val loss, sample", ok,
                 f"max rel err loss {loss:.2e} norm {norm:.2e} val {val:.2e}, sample equal "
                 f"{sample == rsample}")


def max_rel(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.max(np.abs(a - b) / np.abs(b)))


def round_up(x, m):
    return (x + m - 1) // m * m


def unit_numels(L, C, T, V):
    """The flat length of each unit of a dense GPT-2 at tp = 1 (model/gpt_layout.cu): the root,
    then L blocks; tensors start at multiples of 64 elements."""
    def unit(sizes):
        n = 0
        for k in sizes:
            n = round_up(n, 64) + k
        return round_up(n, 64)
    Vp = round_up(V, 128)
    root = unit([Vp * C, T * C, C, C])
    # matrices, column-parallel biases, row-parallel biases, LayerNorms (model/gpt.cu)
    block = unit([3 * C * C, C * C, 4 * C * C, 4 * C * C, 3 * C, 4 * C, C, C, C, C, C, C])
    return [root] + [block] * L


def processes_with(marker):
    """The pids whose command line contains marker."""
    pids = []
    for d in glob.glob("/proc/[0-9]*"):
        try:
            with open(d + "/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    pids.append(int(os.path.basename(d)))
        except OSError:
            pass
    return pids


def kill_job(p, marker):
    """SIGKILL to mpirun's process group (p started with start_new_session=True) and to any rank
    of this job (its command line holds marker) outside it."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait()
    deadline = time.time() + 10
    while time.time() < deadline:
        left = processes_with(marker)
        if not left:
            return
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


def steps_against(pattern, reference):
    """The steps whose loss the metrics files matching pattern logged (lines cut by a kill are
    skipped), and those among them whose loss differs from reference[step]: (seen, mismatched)."""
    mismatched, seen = set(), set()
    for path in sorted(glob.glob(pattern)):
        for line in open(path):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by the kill
            if "step" in rec and "loss" in rec and "val_loss" not in rec:
                seen.add(rec["step"])
                if rec["loss"] != reference[rec["step"]]:
                    mismatched.add(rec["step"])
    return seen, mismatched


def json_records(path):
    """Every record of a metrics file, in file order (a line cut by a kill is skipped)."""
    out = []
    with open(path) as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def rank_pids(marker):
    """{world rank: pid} of the ranks (not mpirun) whose command line holds marker."""
    found = {}
    for d in glob.glob("/proc/[0-9]*"):
        try:
            with open(d + "/cmdline", "rb") as f:
                cmd = f.read()
            if marker.encode() not in cmd or b"mpirun" in cmd.split(b"\0")[0]:
                continue
            with open(d + "/environ", "rb") as f:
                env = f.read().split(b"\0")
            rank = [e for e in env if e.startswith(b"OMPI_COMM_WORLD_RANK=")]
            if rank:
                found[int(rank[0].split(b"=")[1])] = int(os.path.basename(d))
        except OSError:
            pass
    return found


def verify_manifest(ckpt):
    """Every manifest entry of a checkpoint present with its size and zlib CRC32 (computed here,
    independently of the trainer): "" or the problem."""
    try:
        with open(os.path.join(ckpt, "manifest.txt"), "rb") as f:
            text = f.read()
    except OSError as e:
        return str(e)
    end = text.rfind(b"end ")
    if int(text[end + 4:].split()[0], 16) != zlib.crc32(text[:end]):
        return "manifest's own checksum"
    for line in text[:end].decode().splitlines()[1:]:
        size, crc, name = line.split()
        try:
            with open(os.path.join(ckpt, name), "rb") as f:
                data = f.read()
        except OSError:
            return name
        if len(data) != int(size) or zlib.crc32(data) != int(crc, 16):
            return name
    return ""
