"""test/test_stream_schedules.py - the CUDA trainer's streams run out of program order: every
layout of the emulated trainer gives bitwise the same losses, gradient norms and checkpoint
tensors under schedules that run each rank's streams late or in a random order as under the
synchronous one (EMU_STREAMS, test/emu/streams.cpp).

On a GPU a rank's streams (compute, communication, copies) run at the same time, ordered only by
the events and waits the code declares; a missing wait is a silent, run-to-run different
corruption. The emulated runtime queues each stream's work and runs it only when the host waits,
in an order the schedule picks among those the declared dependencies allow:
  late          only what the host waits for, as late as possible;
  others-first  every other stream before the one waited for;
  random:SEED   a random runnable stream each time.
Under every schedule a program whose dependencies are complete computes the same bits (the
kernels and the NCCL stand-in's reductions are deterministic), so each layout's run is compared
bit for bit with its run under `sync` (every piece of work run when it is queued, as before).

Layouts (two ranks, NCCL stand-in unless said): DDP, ZeRO-1 with the optimizer in pinned host
memory, ZeRO-2 with it in a file, FSDP (over NCCL, and over MPI: device buffers staged through
the host),
int8 and top-k compressed DDP gradients, tp = 2 with and without SP and with SP overlapped
(tp_overlap: chunks on the communication stream), pp = 2 1F1B and zb-v,
cp = 2 ring attention, MoE dp2 x ep2, Llama cp2, DiLoCo (2 islands), DDP saving
asynchronous checkpoints (their tensors compared too), ZeRO-2 with gradient buckets of two
blocks (bucket_mb) over 2 micro-batches, and Llama (4 blocks) FSDP gathering two units ahead
(fsdp_prefetch = 2) with buckets. In `make test` (the emu-streams group) the
core layouts (ZeRO-2 offloaded to a file, pp 1F1B, cp ring, DDP with asynchronous checkpoints)
run under `late` and `others-first`, which run each pair of streams both ways round;
TEST_FULL=1 runs every layout under those and two random seeds.

Sabotage: copies of ./train_emu with one dependency broken (SABOTAGES: one source file changed,
recompiled and linked with ./train_emu's other objects) must differ from their own sync run under
at least one schedule - the check that the schedules can fail. `make test` runs the DDP one,
TEST_FULL=1 all eight (two of them tp_overlap's: a chunk's GEMM not waiting for its piece, a
reduce-scatter piece sent before its GEMM wrote it).

Host synchronisations: a non-logging step waits on the host at most the number HOST_SYNCS
states (EMU_HOST_SYNCS=1 counts them): zero, or the stated waits for what the host computes on
or sizes work by (the optimizer offload, MPI's staging, MoE's token counts, a checkpoint every
step). DDP in `make test`; every layout with TEST_FULL=1, and a sabotaged copy that reads the
gradient norm back every step must exceed DDP's zero.

Environment: TRAIN (./train_emu), TEST_FULL, SEED (the data and the random schedules' seeds).
"""
import glob
import os
import re
import sys
import tempfile

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from trainer import (MPIRUN, Checks, base_sections, make_experiment, read_metrics,  # noqa: E402
                     seeded_rng, write_config)
import subprocess  # noqa: E402

TRAIN = os.environ.get("TRAIN", "./train_emu")
BUILD = os.environ.get("BUILD", "build")
FULL = os.environ.get("TEST_FULL") == "1"
STEPS = 3
checks = Checks("test_stream_schedules")

# (label, [parallel] and [train] overrides, extra sections, core)
LAYOUTS = [
    ("DDP dp=2", {"dp": 2}, {}, False),
    ("ZeRO-1 dp=2 offload cpu", {"dp": 2, "zero": 1}, {"optimizer_offload": "cpu"}, False),
    ("ZeRO-2 dp=2 offload nvme", {"dp": 2, "zero": 2}, {"optimizer_offload": "nvme"}, True),
    ("FSDP dp=2", {"dp": 2, "fsdp": True}, {}, False),
    ("FSDP dp=2 (MPI)", {"dp": 2, "fsdp": True, "backend": "mpi"}, {}, False),
    ("DDP int8 compression", {"dp": 2, "grad_compression": "int8"}, {}, False),
    ("DDP top-k compression", {"dp": 2, "grad_compression": "topk", "topk_ratio": 0.1}, {}, False),
    ("tp=2 sp", {"tp": 2, "sp": True}, {"grad_accum": 2}, False),
    ("tp=2 no sp", {"tp": 2, "sp": False}, {}, False),
    ("tp=2 sp overlap", {"tp": 2, "sp": True, "tp_overlap": True}, {"grad_accum": 2}, False),
    ("pp=2 1f1b", {"pp": 2}, {"grad_accum": 2}, True),
    ("pp=2 zb-v", {"pp": 2, "pp_schedule": "zb-v", "pp_virtual": 2},
     {"grad_accum": 2, "layers": 4}, False),
    ("cp=2 ring attention", {"cp": 2}, {"grad_accum": 2}, True),
    ("MoE dp=2 ep=2", {"dp": 2, "ep": 2}, {"moe": True}, False),
    ("Llama cp=2", {"cp": 2}, {"llama": True}, False),
    ("DiLoCo 2 islands", {"dp": 2, "diloco_islands": 2, "diloco_every": 2}, {}, False),
    ("DDP async checkpoints", {"dp": 2}, {"checkpoint": True}, True),
    ("ZeRO-2 dp=2 bucket_mb", {"dp": 2, "zero": 2, "bucket_mb": 4}, {"grad_accum": 2}, False),
    ("FSDP dp=2 fsdp_prefetch 2 bucket_mb", {"dp": 2, "fsdp": True, "fsdp_prefetch": 2,
                                              "bucket_mb": 1}, {"layers": 4}, False),
]


def schedules(seed):
    if FULL:
        return ["late", "others-first", f"random:{seed}", f"random:{seed + 1}"]
    return ["late", "others-first"]


def sections_for(tmp, name, parallel, extra):
    """The config of one layout's run: the tiny model, 2 ranks, every step logged."""
    sec = base_sections(tmp, STEPS, lr=1e-3, micro_batch=2, weight_decay=0.1, grad_clip=1.0)
    if extra.get("moe") or extra.get("llama") or extra.get("layers"):
        del sec["init"]
        model = {"n_layer": extra.get("layers", 2), "n_head": 2, "d_model": 128, "seq_len": 32, "vocab_size": 101}
        if extra.get("moe"):
            model.update(n_experts=4, top_k=2, moe_every=2, d_expert=64)
        else:
            model.update(arch="llama", n_kv_head=1, d_ff=176, rope_theta=10000.0)
        sec["model"] = model
    sec["train"]["grad_accum"] = extra.get("grad_accum", 1)
    if "optimizer_offload" in extra:
        sec["train"]["optimizer_offload"] = extra["optimizer_offload"]
        if extra["optimizer_offload"] == "nvme":
            os.makedirs(os.path.join(tmp, name + "_offload"), exist_ok=True)
            sec["train"]["offload_dir"] = os.path.join(tmp, name + "_offload")
    sec["parallel"] = dict({"backend": "nccl"}, **parallel)
    if extra.get("checkpoint"):
        sec["checkpoint"] = {"dir": os.path.join(tmp, name + "_ckpt"), "every": 1, "keep": 10,
                             "async": True}
    sec["log"]["metrics"] = os.path.join(tmp, name + ".jsonl")
    return sec


def run_layout(tmp, label, parallel, extra, schedule, binary=TRAIN):
    """Runs the layout under one schedule; returns (records, {checkpoint tensor: array})."""
    name = "".join(c if c.isalnum() else "_" for c in label) + "_" + schedule.replace(":", "")
    sec = sections_for(tmp, name, parallel, extra)
    cmd = MPIRUN + ["-np", "2", binary, write_config(tmp, name + ".toml", sec)]
    env = dict(os.environ, EMU_STREAMS=schedule, OMP_NUM_THREADS="1")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    if r.returncode != 0:
        return None, None, (r.stdout + r.stderr)[-2000:]
    if f"emu: stream schedule {schedule}" not in r.stderr:
        return None, None, "the runtime did not print the schedule"
    records = [{k: rec[k] for k in ("step", "loss", "grad_norm")}
               for rec in read_metrics(sec["log"]["metrics"])[0]]
    return records, checkpoint_tensors(sec), ""


def checkpoint_tensors(sec):
    out = {}
    if "checkpoint" not in sec:
        return out
    for index in sorted(glob.glob(os.path.join(sec["checkpoint"]["dir"], "step_*",
                                               "checkpoint.h5"))):
        step = os.path.basename(os.path.dirname(index))
        with h5py.File(index, "r") as f:
            def grab(name, obj):
                if isinstance(obj, h5py.Dataset) and name != "config":
                    out[f"{step}/{name}"] = obj[...]
            f.visititems(grab)
    return out


def same_tensors(a, b):
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_layouts(rng):
    seed = int(rng.integers(1, 2**31))
    with tempfile.TemporaryDirectory() as tmp:
        make_experiment(tmp, rng, L=2, NH=2, C=128, T=32, V=101, n_tokens=STEPS * 4 * 32 + 1)
        for label, parallel, extra, core in LAYOUTS:
            if not (core or FULL) or not checks.wanted(label):
                continue
            want, want_ckpt, why = run_layout(tmp, label, parallel, extra, "sync")
            if want is None:
                checks.check(f"{label}: sync run", False, why)
                continue
            for schedule in schedules(seed):
                got, got_ckpt, why = run_layout(tmp, label, parallel, extra, schedule)
                ok = got is not None and got == want and len(got) == STEPS and \
                    same_tensors(got_ckpt, want_ckpt)
                detail = why or (f"{len(got)} steps, {len(got_ckpt)} checkpoint tensors" if ok
                                 else f"got {got} want {want}"
                                 if got != want else "checkpoint tensors differ")
                checks.check(f"{label}: {schedule} bitwise equal to sync", ok, detail)


# --- sabotage: broken copies of ./train_emu that the schedules must catch --------------------
# (name, layout label, file, [(text, replacement)], what it breaks). Each replacement must match
# exactly once. The copy is built from ./train_emu's objects with the one file recompiled.
SABOTAGES = [
    ("ddp-no-wait", "DDP dp=2", "parallel/ddp.cu",
     [("  ops::stream_wait_event(st.comm, us.reduce_done);\n", "")],
     "the comm stream's wait for the finished bucket before DDP's all-reduce removed"),
    ("fsdp-no-gather-wait", "FSDP dp=2", "parallel/fsdp.cu",
     [("  ops::stream_wait_event(st.compute, us.gather_done);\n", "")],
     "FSDP's compute stream uses a gathered weight without waiting for its all-gather"),
    ("cp-event-before-producer", "cp=2 ring attention", "parallel/context_parallel.cu",
     [("  ops::event_record(cp.ready, s);\n  ops::stream_wait_event(cp.ring, cp.ready);",
       "  ops::stream_wait_event(cp.ring, cp.ready);"),
      ("  local_kv(cp, cp.kv[0], qkv, B, s);\n  bool written",
       "  ops::event_record(cp.ready, s);\n  local_kv(cp, cp.kv[0], qkv, B, s);\n  bool written")],
     "ring attention's send event recorded before the copy that produces the K/V it sends"),
    ("offload-slot-before-copy", "ZeRO-1 dp=2 offload cpu", "parallel/offload.cu",
     [("    ops::event_sync(o.sent[s]);         // the copy up out of this slot (unit u-2) is done\n",
       "")],
     "the optimizer offload rewrites its pinned staging slot before the copy out of it (the "
     "copy's event) is done"),
    ("cp-ring-overwrites", "cp=2 ring attention", "parallel/context_parallel.cu",
     [("  ops::event_record(cp.ready, s);\n  ops::stream_wait_event(cp.ring, cp.ready);\n", "")],
     "ring attention's ring stream receives the next K/V without waiting for the compute "
     "stream: the receive overwrites the buffer the previous blocks still read"),
    ("bucket-no-wait", "ZeRO-2 dp=2 bucket_mb", "parallel/grad_buckets.cu",
     [("  comm_after_compute(st);  // the unit's backward is queued on the compute stream\n", "")],
     "a gradient bucket's copy out of the unit's gradient does not wait for its backward"),
    ("tp-overlap-no-chunk-wait", "tp=2 sp overlap", "parallel/tensor_parallel_overlap.cu",
     [("  if (j > 0) ops::stream_wait_event(s, tp.chunks->gathered[j - 1]);\n", "")],
     "tp_overlap's GEMM on a gathered chunk does not wait for the chunk to arrive"),
    ("tp-overlap-send-unwritten", "tp=2 sp overlap", "parallel/tensor_parallel_overlap.cu",
     [("    ops::stream_wait_event(o.ring, o.computed[j]);\n", "")],
     "tp_overlap's reduce-scatter sends an owner's rows without waiting for the GEMM that "
     "writes them"),
]
CORE_SABOTAGES = ("ddp-no-wait",)


def link_info():
    out = subprocess.run(["make", "-s", f"BUILD={BUILD}", "emu-train-link-info"],
                         capture_output=True, text=True, check=True).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def build_sabotaged(name, path, replacements):
    """A copy of ./train_emu with `path` changed; returns the binary's path (or raises)."""
    info = link_info()
    with open(path) as f:
        text = f.read()
    for old, new in replacements:
        if text.count(old) != 1:
            raise RuntimeError(f"sabotage {name}: '{old.strip()}' occurs {text.count(old)} times "
                               f"in {path} (the code moved: update SABOTAGES)")
        text = text.replace(old, new)
    work = os.path.join(BUILD, "sabotage", name)
    os.makedirs(work, exist_ok=True)
    src, obj = os.path.join(work, os.path.basename(path)), os.path.join(work, "changed.o")
    with open(src, "w") as f:
        f.write(text)
    cxx = info["CXX"].split()
    subprocess.run(cxx + info["CXXFLAGS"].split() + ["-I.", "-x", "c++", "-c", src, "-o", obj],
                   check=True)
    original = os.path.join(BUILD, "host", path + ".o")
    objects = [obj if o == original else o for o in info["OBJ"].split()]
    if obj not in objects:
        raise RuntimeError(f"sabotage {name}: {original} is not among ./train_emu's objects")
    binary = os.path.join(work, "train_emu")
    subprocess.run(cxx + ["-o", binary] + objects + info["LDLIBS"].split(), check=True)
    return binary


def test_sabotage(rng):
    seed = int(rng.integers(1, 2**31))
    with tempfile.TemporaryDirectory() as tmp:
        make_experiment(tmp, rng, L=2, NH=2, C=128, T=32, V=101, n_tokens=STEPS * 4 * 32 + 1)
        layouts = {label: (parallel, extra) for label, parallel, extra, _ in LAYOUTS}
        for name, label, path, replacements, what in SABOTAGES:
            if not (FULL or name in CORE_SABOTAGES) or not checks.wanted(f"sabotage {name}"):
                continue
            binary = build_sabotaged(name, path, replacements)
            parallel, extra = layouts[label]
            want, _, why = run_layout(tmp, label, parallel, extra, "sync", binary)
            found = []
            for schedule in schedules(seed)[:3]:
                got, _, err = run_layout(tmp, label, parallel, extra, schedule, binary)
                if got != want or err:
                    found.append(schedule)
            checks.check(f"sabotage {name} fails ({what}; {label})",
                         want is not None and len(found) > 0,
                         f"found by {', '.join(found)}" if found else
                         why or "every schedule gave sync's bits")


# --- host synchronisations of a non-logging step ---------------------------------------------
# The runtime counts every call that makes the host wait (EMU_HOST_SYNCS=1: in all and by call).
# A step's count is the difference between a 5-step and a 4-step run logging only at the end
# (the extra step is a non-logging one), held to these numbers. A step's loss and gradient norm
# stay on the device (the norm, the non-finite check's inputs and the clip factor: param_store.cu
# grad_norm; AdamW reads the factor there) and are read back only when a log line, a checkpoint
# or an evaluation is due (training/step_readback.h); the pipeline's timing events are read only
# by the end-of-run report (pipeline.cu). So a non-logging step waits on the host zero times,
# except where the host itself computes on, or sizes work by, the step's device results:
#   optimizer offload (ZeRO-1 to host memory, ZeRO-2 to a file): 7 cudaEventSynchronize - the host
#   runs AdamW on the gradients, so it waits for the clip factor's copy down (1) and, per unit
#   (3), for its gradient's copy down and for its staging slot's previous copy up (offload.cu);
#   FSDP over MPI: 60 - the MPI backend stages every collective's device buffers through the host
#   (a stream synchronisation and the copies: comm_mpi.cu), as MPI without CUDA support must;
#   MoE: 6 - the router's choices come to the host, where they size the dispatch and the
#   all-to-all (3 pageable copies and their stream synchronisations: model/moe.cu);
#   DDP with asynchronous checkpoints: 20 - a checkpoint is due every step there (every = 1), and
#   a save copies the shards to the host (checkpoint/async_save.cu): no step is a plain one.
# (Not held here, by option: [train] skip_spikes reads every step's loss before the update and
# [log] grad_noise_scale the norm: training/step_readback.h.) `make test` checks DDP; TEST_FULL=1
# every layout.
HOST_SYNCS = {"DDP dp=2": 0, "ZeRO-1 dp=2 offload cpu": 7, "ZeRO-2 dp=2 offload nvme": 7,
              "FSDP dp=2": 0, "FSDP dp=2 (MPI)": 60, "DDP int8 compression": 0,
              "DDP top-k compression": 0, "tp=2 sp": 0, "tp=2 no sp": 0, "tp=2 sp overlap": 0,
              "pp=2 1f1b": 0,
              "pp=2 zb-v": 0, "cp=2 ring attention": 0, "MoE dp=2 ep=2": 6, "Llama cp=2": 0,
              "DiLoCo 2 islands": 0, "DDP async checkpoints": 20, "ZeRO-2 dp=2 bucket_mb": 0,
              "FSDP dp=2 fsdp_prefetch 2 bucket_mb": 0}
# The check can fail: a copy whose step reads the gradient norm back (TEST_FULL=1).
SYNC_SABOTAGE = ("norm-read-back", "DDP dp=2", "parallel/param_store.cu",
                 [("                          st.compute);\n}\n",
                   "                          st.compute);\n  grad_norm_read(st);\n}\n")],
                 "the gradient norm read back to the host every step")


def host_syncs(tmp, label, parallel, extra, steps, binary=TRAIN):
    """(rank 0's host synchronisations, by call) of a run of `steps` steps logging at the end."""
    name = "".join(c if c.isalnum() else "_" for c in label) + f"_syncs{steps}"
    sec = sections_for(tmp, name, parallel, extra)
    sec["train"]["steps"], sec["log"]["every"] = steps, 1000
    cmd = MPIRUN + ["-np", "2", binary, write_config(tmp, name + ".toml", sec)]
    env = dict(os.environ, EMU_STREAMS="late", EMU_HOST_SYNCS="1", OMP_NUM_THREADS="1")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    found = re.findall(r"emu: host synchronisations (\d+) \((.*)\)", r.stderr)
    if r.returncode != 0 or not found:
        raise RuntimeError(f"{label}: {steps} steps: {(r.stdout + r.stderr)[-1500:]}")
    n, calls = max(found, key=lambda f: int(f[0]))
    return int(n), dict((c.rsplit(" ", 1)[0], int(c.rsplit(" ", 1)[1])) for c in calls.split(", ")
                        if c)


def step_syncs(tmp, label, parallel, extra, binary=TRAIN):
    """A non-logging step's host synchronisations: (count, {call: count})."""
    (a, calls_a), (b, calls_b) = (host_syncs(tmp, label, parallel, extra, n, binary)
                                  for n in (4, 5))
    return b - a, {c: calls_b[c] - calls_a.get(c, 0) for c in calls_b
                   if calls_b[c] != calls_a.get(c, 0)}


def test_host_syncs(rng):
    with tempfile.TemporaryDirectory() as tmp:
        make_experiment(tmp, rng, L=2, NH=2, C=128, T=32, V=101, n_tokens=6 * 4 * 32 + 1)
        for label, parallel, extra, _ in LAYOUTS:
            if label not in HOST_SYNCS or not (FULL or label == "DDP dp=2") or \
                    not checks.wanted(f"host syncs {label}"):
                continue
            n, step = step_syncs(tmp, label, parallel, extra)
            checks.check(f"host syncs {label}: a non-logging step waits on the host at most "
                         f"{HOST_SYNCS[label]} times", n <= HOST_SYNCS[label], f"{n}: {step}")
        # the check can fail: a copy whose step reads the gradient norm back to the host
        name, label, path, replacements, what = SYNC_SABOTAGE
        if not FULL or not checks.wanted(f"sabotage {name}"):
            return
        layout = {lb: (p, e) for lb, p, e, _ in LAYOUTS}[label]
        binary = build_sabotaged(name, path, replacements)
        n, step = step_syncs(tmp, label, *layout, binary=binary)
        checks.check(f"sabotage {name} fails the host-sync check ({what}; {label})",
                     n > HOST_SYNCS[label], f"{n}: {step}")


def main():
    rng = seeded_rng("test_stream_schedules", f"; TRAIN={TRAIN}; full matrix: {FULL}")
    checks.run_each(lambda: test_layouts(rng), lambda: test_sabotage(rng),
                    lambda: test_host_syncs(rng))
    checks.report()


if __name__ == "__main__":
    main()
