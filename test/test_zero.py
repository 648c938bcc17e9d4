"""test/test_zero.py - the ZeRO ladder ([parallel] zero = 0..3, parallel/zero.cu) and optimizer
offload ([train] optimizer_offload = "cpu" | "nvme", parallel/offload.cu) against DDP.

Tiny GPT-2 from an llm.c file (L=2, NH=4, C=44, T=16, V=101: shards split rows mid-row), fixed
global batch of 4 sequences, AdamW with weight decay, clipping and a cosine schedule (lr 1e-3), fp32:
1. Losses and gradient norms of every stage and offload equal DDP's on the same layout within
   1e-6 relative over 20 steps (reduction-order rounding: at dp4 MPI's reduce-scatter sums in
   another order than its all-reduce, and with grad_accum 2 ZeRO-2 sums each micro-batch over
   the ranks before adding them; at dp2 with one micro-batch every stage is bitwise DDP), on dp2,
   dp4, dp2 with grad_accum 2, dp2 x tp2 (sequence parallel) and dp2 x pp2 with grad_accum 2.
   The runs train at lr 1e-3: measured over 6 seeds at most 5.3e-8 on losses and 5.6e-8 on
   norms. (At lr 1e-2 the same rounding grows to 4e-6 on losses and 3e-4 on norms within 20
   steps: Adam divides by sqrt(v), so elements whose gradient is rounding noise get full-size
   updates, and the runs drift apart; that is chaos, not a bug, and no tolerance can tell it from
   one.) An offloaded run equals the same stage on the device bit for bit (the CPU backend's
   AdamW and the host optimizer are one loop). In bf16 (dp2), ZeRO-2 with offload to the host
   equals ZeRO-2 bit for bit (the host rounds the new weights as the device does).
2. On the dp-only layouts, what each rank holds and moves equals the ladder's analytic count
   (parallel/zero.cu, parallel/offload.cu), computed here from the unit sizes: device state
   bytes, pinned host bytes and file bytes (run record), and per step the dp collectives' calls
   and bytes and the offload's bytes over the host link and to the file (step records).
3. Checkpoints written at one stage resume at another bit for bit: a dp2 ZeRO-1 run saves at
   step 5; resumed at DDP, at ZeRO-2 with offload to the host and at ZeRO-3 with offload to
   nvme, steps 6-10 (losses, norms) equal the uninterrupted run exactly (at dp2 every stage
   steps bitwise alike: the gradient norm sums each rank's shard at every stage); a ZeRO-2 +
   nvme checkpoint resumes at ZeRO-1 the same way.
4. NVMe offload survives kill -9 of the whole job mid-run (3 kills at random moments while it
   trains and saves every 3 steps): the offload files are left behind, the next run re-creates
   them and resumes from the checkpoint, every step's loss equals the uninterrupted run's exactly,
   and a run that ends leaves no offload file.
5. With offload the step line shows the host memory and the host optimizer's time after the
   device memory, and the step records the same (host_bytes, host_optimizer_ms within the step).
6. offload_dir missing, not writable (a read-only tmpfs) or full (a 64 KiB tmpfs) is refused
   at start-up: exit status 1, a message naming the directory and the problem, no step line, and
   no offload file anywhere (the tmpfs cases need user namespaces: `unshare -rm`).
"""
import glob
import os
import random
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from trainer import (MPIRUN, TRAIN_CPU, Checks, base_sections, make_experiment,  # noqa: E402
                     max_rel, read_metrics, read_run_info, run, seeded_rng, write_config)
from trainer import kill_job, round_up, steps_against, unit_numels  # noqa: E402

checks = Checks("test_zero")
L, NH, C, T, V = 2, 4, 44, 16, 101
GLOBAL_ROWS, STEPS = 4, 20
BLOCK = 4096  # the offload file's parts are multiples of it


def ladder(zero, offload, dp, accum, b):
    """What a rank of a dp-only layout holds and moves per the ladder (parallel/zero.cu,
    parallel/offload.cu): (state, host, disk bytes), the dp collectives of a step, the offload's
    bytes of a step."""
    units = unit_numels(L, C, T, V)
    N = dp if zero > 0 else 1
    padded = [round_up(n, N * 64) for n in units]
    shard = [p // N for p in padded]
    master = 0 if (b == 4 and offload == "none") else 4  # fp32 on the device: the working copy
    state = 0
    for n, p, s in zip(units, padded, shard):
        optimizer = (master + 8) * s if offload == "none" else 0
        weights = [b * n, b * p, b * p, b * s][zero]
        grads = [4 * n, 4 * p, 4 * s, 4 * s][zero]
        state += weights + grads + optimizer
    host = disk = 0
    if offload != "none":
        host = 4 * sum(shard) + 2 * b * max(shard)  # gradients, two staging buffers
        if offload == "cpu":
            host += 12 * sum(shard)
        else:
            host += 2 * 3 * round_up(4 * max(shard), BLOCK)
            disk = sum(3 * round_up(4 * s, BLOCK) for s in shard)
    comm = {}
    if dp > 1:
        gather = {"calls": len(units), "bytes": b * sum(padded)}
        if zero == 0:
            comm = {"all_reduce": {"calls": len(units), "bytes": 4 * sum(units)}}
        elif zero == 1:
            comm = {"reduce_scatter": {"calls": len(units), "bytes": 4 * sum(padded)},
                    "all_gather": gather}
        elif zero == 2:
            comm = {"reduce_scatter": {"calls": 1 + accum * L,
                                       "bytes": 4 * (padded[0] + accum * sum(padded[1:]))},
                    "all_gather": gather}
        else:  # the root gathered once per step, each block twice per micro-batch
            comm = {"all_gather": {"calls": 1 + accum * 2 * L,
                                   "bytes": b * (padded[0] + accum * 2 * sum(padded[1:]))},
                    "reduce_scatter": {"calls": 1 + accum * L,
                                       "bytes": 4 * (padded[0] + accum * sum(padded[1:]))}}
    moved = None
    if offload != "none":
        moved = {"to_host_bytes": 4 * sum(shard), "to_device_bytes": b * sum(shard),
                 "disk_read_bytes": disk, "disk_write_bytes": disk}
    return (state, host, disk), comm, moved


def train(tmp, name, par, zero=0, offload="none", accum=1, dtype="fp32", steps=STEPS,
          extra=(), check=True):
    dp = par.get("dp", 1)
    world = dp * par.get("tp", 1) * par.get("pp", 1)
    sec = base_sections(tmp, steps, lr=1e-3, micro_batch=GLOBAL_ROWS // dp // accum,
                        grad_accum=accum, weight_decay=0.1, grad_clip=1.0,
                        lr_schedule="cosine", warmup_steps=2, min_lr=1e-4)
    sec["parallel"] = dict(par, zero=zero)
    sec["train"]["optimizer_offload"] = offload
    if offload == "nvme":
        sec["train"]["offload_dir"] = os.path.join(tmp, "offload")
        os.makedirs(sec["train"]["offload_dir"], exist_ok=True)
    sec["precision"] = {"compute": dtype}
    sec["log"]["metrics"] = os.path.join(tmp, f"{name}.jsonl")
    if os.path.exists(sec["log"]["metrics"]):
        os.remove(sec["log"]["metrics"])
    r = run(write_config(tmp, f"{name}.toml", sec), list(extra),
            np_ranks=world if world > 1 else 0, check=check)
    if not check:
        return r
    steps_, _ = read_metrics(sec["log"]["metrics"])
    return steps_, read_run_info(sec["log"]["metrics"])


def label(zero, offload):
    return f"zero={zero}" + (f" offload={offload}" if offload != "none" else "")


# Each layout: DDP first (the reference), then the stages and offloads compared with it.
LAYOUTS = [
    ("dp2", {"dp": 2}, 1, [(1, "none"), (2, "none"), (3, "none"), (1, "cpu"), (2, "nvme"),
                           (3, "cpu")]),
    ("dp4", {"dp": 4}, 1, [(1, "none"), (2, "cpu"), (3, "nvme")]),
    ("dp2 grad_accum 2", {"dp": 2}, 2, [(1, "none"), (2, "none"), (2, "cpu")]),
    ("dp2 x tp2 sp", {"dp": 2, "tp": 2}, 1, [(1, "none"), (2, "nvme")]),
    ("dp2 x pp2 grad_accum 2", {"dp": 2, "pp": 2}, 2, [(1, "none"), (2, "cpu"), (3, "nvme")]),
]


def check_counts(what, steps, info, zero, offload, dp, accum, b):
    (state, host, disk), comm, moved = ladder(zero, offload, dp, accum, b)
    got = (info["state_bytes"], info["host_bytes"], info["disk_bytes"])
    checks.check(f"{what}: bytes held = the ladder", got == (state, host, disk),
                 f"state/host/disk {got}, analytic {(state, host, disk)}")
    got_comm = [s["comm"].get("dp", {}) for s in steps]
    got_moved = [s.get("offload") for s in steps]
    checks.check(f"{what}: bytes moved per step = the ladder",
                 all(g == comm for g in got_comm) and all(m == moved for m in got_moved),
                 f"dp {got_comm[0]}, offload {got_moved[0]} (analytic {comm}, {moved})")


def test_equivalence(tmp):
    stages = {}  # (layout, zero, offload) -> losses, for the bitwise offload comparison
    for name, par, accum, rungs in LAYOUTS:
        ref, ref_info = train(tmp, f"{name}_ddp".replace(" ", "_"), par, accum=accum)
        dp_only = set(par) == {"dp"}
        if dp_only:
            check_counts(f"{name} DDP", ref, ref_info, 0, "none", par["dp"], accum, 4)
        for zero, offload in rungs:
            what = f"{name} {label(zero, offload)}"
            steps, info = train(tmp, what.replace(" ", "_").replace("=", ""), par, zero, offload,
                                accum)
            loss = max_rel([s["loss"] for s in steps], [s["loss"] for s in ref])
            norm = max_rel([s["grad_norm"] for s in steps], [s["grad_norm"] for s in ref])
            checks.check(f"{what}: losses and norms = DDP", len(steps) == STEPS and
                         loss < 1e-6 and norm < 1e-6,
                         f"max rel err loss {loss:.2e} norm {norm:.2e} over {STEPS} steps")
            stages[(name, zero, offload)] = [(s["loss"], s["grad_norm"]) for s in steps]
            if dp_only:
                check_counts(what, steps, info, zero, offload, par["dp"], accum, 4)
        for (lay, zero, offload), got in stages.items():
            if lay == name and offload != "none" and (lay, zero, "none") in stages:
                same = got == stages[(lay, zero, "none")]
                checks.check(f"{name} {label(zero, offload)}: = zero={zero} on the device, "
                             "bit for bit", same, f"{len(got)} steps equal: {same}")


def test_bf16(tmp):
    device, info = train(tmp, "bf16_zero2", {"dp": 2}, 2, dtype="bf16")
    host, host_info = train(tmp, "bf16_zero2_cpu", {"dp": 2}, 2, "cpu", dtype="bf16")
    same = [(s["loss"], s["grad_norm"]) for s in device] == \
        [(s["loss"], s["grad_norm"]) for s in host]
    checks.check("bf16 dp2 zero=2 offload=cpu = zero=2 on the device, bit for bit", same,
                 f"losses {host[-1]['loss']} vs {device[-1]['loss']} at step {STEPS}")
    check_counts("bf16 dp2 zero=2 offload=cpu", host, host_info, 2, "cpu", 2, 1, 2)


def test_step_line(tmp):
    """With offload the step line shows device memory, host memory and the host optimizer's time,
    and the step records carry the same: host_bytes equal to the run record's, a host optimizer
    time inside the step's."""
    r = train(tmp, "line", {"dp": 2}, 3, "cpu", steps=3, check=False)
    steps, _ = read_metrics(os.path.join(tmp, "line.jsonl"))
    info = read_run_info(os.path.join(tmp, "line.jsonl"))
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("step ")]
    host = f"| host {info['host_bytes'] / 2**30:.2f} GiB, optimizer "
    ok = r.returncode == 0 and len(lines) == 3 and all(
        "| mem " in ln and host in ln and ln.index("| mem ") < ln.index(host) for ln in lines)
    ok = ok and all(s["host_bytes"] == info["host_bytes"] and
                    0 < s["host_optimizer_ms"] < s["ms"] for s in steps)
    checks.check("offload: the step line and the step records show host memory and the host "
                 "optimizer's time", ok, lines[-1] if lines else r.stderr[-300:])


def losses(path, key="loss"):
    return {r["step"]: r[key] for r in read_metrics(path)[0]}


def test_checkpoint_across_stages(tmp):
    ck = os.path.join(tmp, "ck_zero1")
    save = [f"--checkpoint.dir={ck}", "--checkpoint.every=5", "--data.shuffle=true"]
    train(tmp, "ck_ref", {"dp": 2}, 1, steps=10, extra=save)
    ref_l, ref_n = losses(f"{tmp}/ck_ref.jsonl"), losses(f"{tmp}/ck_ref.jsonl", "grad_norm")
    ck2 = os.path.join(tmp, "ck_zero2_nvme")
    train(tmp, "ck_nvme", {"dp": 2}, 2, "nvme", steps=10,
          extra=[f"--checkpoint.dir={ck2}", "--checkpoint.every=5", "--data.shuffle=true"])
    legs = [("ZeRO-1 -> DDP", ck, 0, "none"), ("ZeRO-1 -> ZeRO-2 + cpu", ck, 2, "cpu"),
            ("ZeRO-1 -> ZeRO-3 + nvme", ck, 3, "nvme"), ("ZeRO-2 + nvme -> ZeRO-1", ck2, 1, "none")]
    for i, (what, start, zero, offload) in enumerate(legs):
        train(tmp, f"ck_leg{i}", {"dp": 2}, zero, offload, steps=10,
              extra=[f"--checkpoint.resume={start}/step_000005", "--data.shuffle=true"])
        got_l, got_n = losses(f"{tmp}/ck_leg{i}.jsonl"), losses(f"{tmp}/ck_leg{i}.jsonl", "grad_norm")
        same = sorted(got_l) == list(range(6, 11)) and \
            all(got_l[s] == ref_l[s] and got_n[s] == ref_n[s] for s in got_l)
        checks.check(f"checkpoint {what}: steps 6-10 bit-exact", same,
                     f"losses {[got_l.get(s) for s in range(6, 11)]} vs "
                     f"{[ref_l[s] for s in range(6, 11)]}")


def steps_logged(path):
    try:
        return sum(1 for line in open(path) if '"loss"' in line)
    except FileNotFoundError:
        return 0


def test_kill_nvme(tmp):
    steps = 40
    offload_dir = os.path.join(tmp, "offload")
    ck = os.path.join(tmp, "ck_kill")
    train(tmp, "kill_ref", {"dp": 2}, 2, "nvme", steps=steps)
    reference = losses(f"{tmp}/kill_ref.jsonl")
    left_after_clean = sorted(os.listdir(offload_dir))
    sec_args = [f"--checkpoint.dir={ck}", "--checkpoint.every=3", "--checkpoint.keep=2",
                "--checkpoint.resume=latest"]
    cfg = os.path.join(tmp, "kill_ref.toml")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    stale, problems = [], []
    for attempt in range(3):
        metrics = f"{tmp}/kill_{attempt}.jsonl"
        cmd = MPIRUN + ["-np", "2", TRAIN_CPU, cfg, f"--log.metrics={metrics}"] + sec_args
        with open(f"{tmp}/kill_{attempt}.log", "w") as log:
            p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                 start_new_session=True)
            deadline = time.time() + 60
            while steps_logged(metrics) < 4 and p.poll() is None and time.time() < deadline:
                time.sleep(0.005)
            time.sleep(random.uniform(0.0, 0.03))
            if p.poll() is not None:
                problems.append(f"run {attempt} ended before the kill (rc {p.returncode})")
            kill_job(p, cfg)
        stale.append(len(glob.glob(os.path.join(offload_dir, "offload_rank*.bin"))))
    final = run(cfg, [f"--log.metrics={tmp}/kill_final.jsonl"] + sec_args, np_ranks=2,
                check=False)
    if final.returncode != 0:
        problems.append("the final resume failed: " + final.stderr[-400:])
    seen, mismatched = steps_against(f"{tmp}/kill_*.jsonl", reference)
    left = sorted(os.listdir(offload_dir))
    checks.check("nvme offload: kill -9 mid-run, resumed from the checkpoint, bit-exact",
                 not problems and not mismatched and seen == set(range(1, steps + 1)) and
                 stale == [2, 2, 2] and left == [] and left_after_clean == [],
                 f"offload files left by each kill {stale}; steps differing {sorted(mismatched)}; "
                 f"steps seen {len(seen)}/{steps}; left after clean runs {left_after_clean}, "
                 f"{left}; problems {problems}")


def offload_files(root):
    return glob.glob(os.path.join(root, "**", "offload_rank*"), recursive=True)


def refused(what, rc, text, words):
    ok = rc == 1 and all(w in text for w in words) and "| loss" not in text
    checks.check(f"refused: {what}", ok,
                 f"rc {rc}: " + next((ln for ln in text.splitlines() if "error" in ln), "no error"))


def can_unshare():
    try:
        return subprocess.run(["unshare", "-rm", "true"], capture_output=True,
                              timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def test_bad_offload_dir(tmp):
    missing = os.path.join(tmp, "no_such_dir")
    r = train(tmp, "bad_missing", {}, 1, "nvme", steps=2, check=False,
              extra=[f"--train.offload_dir={missing}"])
    refused("offload_dir missing", r.returncode, r.stdout + r.stderr,
            [missing, "no such directory"])
    if not can_unshare():
        print("  SKIP refused: offload_dir read-only / full: no user namespaces for a small tmpfs "
              "(unshare -rm fails here)")
        return
    mount = os.path.join(tmp, "small")
    os.makedirs(mount, exist_ok=True)
    for what, options, words in [("offload_dir not writable (read-only tmpfs)", "ro",
                                  [mount, "not writable", "Read-only file system"]),
                                 ("offload_dir full (64 KiB tmpfs)", "size=64k",
                                  [mount, "is full", "MiB are free"])]:
        cfg = os.path.join(tmp, "bad_tmpfs.toml")
        sec = base_sections(tmp, 2, micro_batch=4)
        sec["parallel"] = {"zero": 1}
        sec["train"].update({"optimizer_offload": "nvme", "offload_dir": mount})
        write_config(tmp, "bad_tmpfs.toml", sec)
        script = (f"mount -t tmpfs -o {options} tmpfs {mount} && "
                  f"{os.path.abspath(TRAIN_CPU)} {cfg}; rc=$?; echo LEFT: $(ls -A {mount}); "
                  f"exit $rc")
        p = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True,
                           text=True, timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"))
        left = p.stdout.split("LEFT:")[-1].strip()
        refused(what, p.returncode, p.stdout + p.stderr, words)
        checks.check(f"{what}: nothing written", left == "" and not offload_files(tmp),
                     f"in the dir: {left!r}; offload files elsewhere: {offload_files(tmp)}")


def main():
    rng = seeded_rng("test_zero")
    random.seed(int(rng.integers(1 << 31)))  # the kills' moments
    with tempfile.TemporaryDirectory() as tmp:
        make_experiment(tmp, rng, L=L, NH=NH, C=C, T=T, V=V)
        test_equivalence(tmp)
        test_bf16(tmp)
        test_step_line(tmp)
        test_checkpoint_across_stages(tmp)
        test_kill_nvme(tmp)
        test_bad_offload_dir(tmp)
        checks.check("no offload file left behind anywhere", not offload_files(tmp),
                     f"{offload_files(tmp)}")
    checks.report()


if __name__ == "__main__":
    main()
