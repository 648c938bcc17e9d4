"""test/test_checkpoint.py - sharded HDF5 checkpoints (checkpoint/checkpoint.h) end to end.

Tiny GPT-2 (L=2, NH=3, C=36, T=16, V=101: rows that FSDP shards split mid-row), fixed global
batch of 4 sequences (np=4 x 1, np=2 x 2, np=1 x 4), shuffled data.
1. Same layout, bit for bit: a np=4 FSDP run saves at steps 5 and 10; resuming step 5 at np=4
   FSDP gives steps 6-10 losses, gradient norms and the step-10 validation loss exactly equal
   to the uninterrupted run, in fp32 and in bf16. The resumed run saves step 10 again into the
   same directory (the swap that replaces a same-named checkpoint).
2. Resharding: np=4 FSDP -> np=2 DDP -> np=1 FSDP, and np=4 DDP -> np=2 FSDP -> np=1 DDP, each
   leg resumed from the previous leg's checkpoint: losses within 1e-5 of the uninterrupted run.
3. kill -9 of the whole job at random moments while it saves every step, 5-12 times (until two
   kills have interrupted a save): after
   each kill `latest` names a checkpoint whose files all match the manifest (checked here with
   zlib's CRC32, independently of the trainer), the next run resumes from it, and every step's
   loss, whichever run computed it, equals the uninterrupted run's exactly; at the end only
   `keep` checkpoints and no temporaries remain.
4. A truncated file, a flipped byte, a missing file and an interrupted save (no manifest) are
   each refused with a message naming the file; a model shape other than the checkpoint's is
   refused naming both shapes.
5. h5py reads the checkpoint without our code: after one lr = 0 step from an llm.c file at np=4
   FSDP, the names and shapes are the model's, model/* equals the llm.c file exactly, optim/m
   and optim/v equal (1-beta1) g and (1-beta2) g^2 for the PyTorch float64 gradient g (1e-4
   relative), and step, seed, data position, writers and the stored config are right; h5dump
   reads a tensor too.
6. Mixture of experts (L=2, E=4 experts of d_expert 48, top_k 2, every block MoE; random init,
   global batch 4): a dp2 x ep2 FSDP run saves at steps 3 and 6. Resumed at step 3 with the same
   layout, steps 4-6 are bit-exact; resumed on one rank and at dp4 x ep4 FSDP, within 1e-5 of the
   uninterrupted run. h5py reads the experts as 3-D datasets ((E, d_expert, C), (E, C,
   d_expert), biases (E, d_expert), (E, C), the router (E, C)) in model/ and both moments, with
   no NaN (no gap), format version 2 and the MoE attributes. A config with another n_experts is
   refused naming both shapes.
The writer geometry of every layout (ep included) is checked exhaustively, without training, by
build/test_checkpoint_writers (test/test_checkpoint_writers.cpp).
"""
import glob
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib

import h5py
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2_reference as ref  # noqa: E402
from trainer import (MPIRUN, TRAIN_CPU, Checks, base_sections, make_experiment,  # noqa: E402
                     read_metrics, run, write_config)
from trainer import kill_job, steps_against, verify_manifest  # noqa: E402
from trainer import with_validation  # noqa: E402

checks = Checks("test_checkpoint")
L, NH, C, T, V = 2, 3, 36, 16, 101
GLOBAL_ROWS = 4


def layout(np_ranks, fsdp):
    return [f"--parallel.dp={np_ranks}", f"--parallel.fsdp={'true' if fsdp else 'false'}",
            f"--train.micro_batch={GLOBAL_ROWS // np_ranks}"]


def trainer(config, np_ranks, fsdp, *overrides, check=True):
    return run(config, layout(np_ranks, fsdp) + list(overrides), np_ranks=np_ranks, check=check)


def losses(path, key="loss"):
    """{step: value} of the step records of a metrics file."""
    return {r["step"]: r[key] for r in read_metrics(path)[0]}


def experiment(tmp, rng, steps, n_tokens=4000):
    make_experiment(tmp, rng, L=L, NH=NH, C=C, T=T, V=V, n_tokens=n_tokens)
    sec = base_sections(tmp, steps, micro_batch=1)
    sec["data"]["shuffle"] = True
    with_validation(sec, tmp, 5, 2)
    return write_config(tmp, "c.toml", sec)


# ---------------------------------------------------------------------------------------------
def test_bit_exact(tmp, rng):
    cfg = experiment(tmp, rng, 10)
    for dt in ("fp32", "bf16"):
        ck = os.path.join(tmp, "ck_" + dt)
        common = [f"--precision.compute={dt}", f"--checkpoint.dir={ck}", "--checkpoint.every=5"]
        trainer(cfg, 4, True, *common, f"--log.metrics={tmp}/ref_{dt}.jsonl")
        out = trainer(cfg, 4, True, *common, f"--checkpoint.resume={ck}/step_000005",
                      f"--log.metrics={tmp}/res_{dt}.jsonl").stdout
        ref_l, res_l = losses(f"{tmp}/ref_{dt}.jsonl"), losses(f"{tmp}/res_{dt}.jsonl")
        ref_n = losses(f"{tmp}/ref_{dt}.jsonl", "grad_norm")
        res_n = losses(f"{tmp}/res_{dt}.jsonl", "grad_norm")
        ref_v = read_metrics(f"{tmp}/ref_{dt}.jsonl")[1][-1]["val_loss"]
        res_v = read_metrics(f"{tmp}/res_{dt}.jsonl")[1][-1]["val_loss"]
        same = (sorted(res_l) == list(range(6, 11)) and
                all(res_l[s] == ref_l[s] and res_n[s] == ref_n[s] for s in res_l) and
                res_v == ref_v)
        checks.check(f"np=4 FSDP {dt} resume at step 5 is bit-exact", same,
                     f"steps 6-10 losses {[res_l.get(s) for s in range(6, 11)]} vs "
                     f"{[ref_l[s] for s in range(6, 11)]}, val {res_v} vs {ref_v}")
        swapped = (open(f"{ck}/latest").read().strip() == "step_000010" and
                   verify_manifest(f"{ck}/step_000010") == "" and
                   not glob.glob(f"{ck}/*.tmp") and "resume" in out)
        checks.check(f"{dt}: re-saving step 10 over the old one", swapped,
                     f"{sorted(os.listdir(ck))}")
    return cfg, os.path.join(tmp, "ck_fp32")


def test_reshard(tmp, cfg, fsdp_ck):
    """Two chains of three layouts; each leg resumes the last leg's checkpoint."""
    ddp_ck = os.path.join(tmp, "ck_ddp4")
    trainer(cfg, 4, False, f"--checkpoint.dir={ddp_ck}", "--checkpoint.every=5",
            f"--log.metrics={tmp}/ref_ddp4.jsonl")
    ref_fsdp, ref_ddp = losses(f"{tmp}/ref_fp32.jsonl"), losses(f"{tmp}/ref_ddp4.jsonl")
    d = max(abs(ref_fsdp[s] - ref_ddp[s]) for s in ref_fsdp)
    checks.check("np=4 DDP and FSDP runs agree", d < 1e-5, f"max |diff| {d:.2e}")
    chains = [("FSDP4 -> DDP2 -> FSDP1", fsdp_ck, ref_fsdp, [(2, False), (1, True)]),
              ("DDP4 -> FSDP2 -> DDP1", ddp_ck, ref_ddp, [(2, True), (1, False)])]
    for name, start, reference, legs in chains:
        got, ckpt = {}, f"{start}/step_000005"
        for i, ((np_ranks, fsdp), last) in enumerate(zip(legs, (7, 10))):
            leg_dir = os.path.join(tmp, f"leg_{name[:4]}_{i}")
            metrics = f"{leg_dir}.jsonl"
            trainer(cfg, np_ranks, fsdp, f"--checkpoint.dir={leg_dir}", f"--train.steps={last}",
                    f"--checkpoint.resume={ckpt}", f"--log.metrics={metrics}")
            got.update(losses(metrics))
            ckpt = f"{leg_dir}/step_{last:06d}"
        d = max(abs(got[s] - reference[s]) for s in range(6, 11)) if len(got) == 5 else 1.0
        checks.check(f"reshard {name}", sorted(got) == list(range(6, 11)) and d < 1e-5,
                     f"steps 6-10 max |loss - uninterrupted| {d:.2e}")


def read_latest(ck):
    try:
        with open(os.path.join(ck, "latest")) as f:
            return f.read().strip()
    except FileNotFoundError:
        return None


def wait_for_saves(ck, count, p, timeout=60):
    """Returns once `latest` has moved `count` times (or the job ended, or time ran out)."""
    last, moved, deadline = read_latest(ck), 0, time.time() + timeout
    while moved < count and p.poll() is None and time.time() < deadline:
        now = read_latest(ck)
        if now != last:
            moved, last = moved + 1, now
        time.sleep(0.002)


def test_kill(tmp, rng):
    """Kills land at random times after 1-3 saves of a run (so mostly inside the next save: a
    step takes ~2 ms, a save ~50 ms), the first one during start-up; at least 5 kills, and on
    until two of them interrupted a save."""
    steps = 40
    cfg = experiment(tmp, rng, steps, n_tokens=1200)  # ~18 steps per epoch: epochs roll over
    ck = os.path.join(tmp, "ck")
    trainer(cfg, 2, True, f"--log.metrics={tmp}/uninterrupted.jsonl")
    reference = losses(f"{tmp}/uninterrupted.jsonl")
    args = [f"--checkpoint.dir={ck}", "--checkpoint.every=1", "--checkpoint.keep=2",
            "--checkpoint.resume=latest"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    bad, mid_save, latest_after = [], 0, []
    attempt = 0
    while attempt < 12 and (attempt < 5 or mid_save < 2) and \
            read_latest(ck) != f"step_{steps:06d}":
        log = open(f"{tmp}/kill_{attempt}.log", "w")
        cmd = MPIRUN + ["-np", "2", TRAIN_CPU, cfg] + layout(2, True) + args + \
            [f"--log.metrics={tmp}/kill_{attempt}.jsonl"]
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                             start_new_session=True)
        if attempt == 0:
            time.sleep(random.uniform(0.05, 0.4))
        else:
            wait_for_saves(ck, random.randint(1, 3), p)
            time.sleep(random.uniform(0.0, 0.05))
        if p.poll() is not None and p.returncode != 0:
            bad.append(f"run {attempt} failed by itself (rc {p.returncode})")
        kill_job(p, cfg)
        log.close()
        mid_save += bool(glob.glob(f"{ck}/*.tmp"))
        name = read_latest(ck)
        latest_after.append(name)
        if name and verify_manifest(f"{ck}/{name}"):
            bad.append(f"after kill {attempt}: latest -> {name}: "
                       f"{verify_manifest(f'{ck}/{name}')} fails")
        attempt += 1
    final = run(cfg, layout(2, True) + args + [f"--log.metrics={tmp}/kill_final.jsonl"],
                np_ranks=2, check=False)
    if final.returncode != 0:
        bad.append("the final resume failed: " + final.stderr[-500:])
    seen, mismatched = steps_against(f"{tmp}/kill_*.jsonl", reference)
    left = sorted(os.listdir(ck))
    checks.check("kill -9 while saving: latest always resumes, bit-exact",
                 not bad and mid_save >= 2 and not mismatched and
                 seen == set(range(1, steps + 1)) and
                 left == ["latest", "lock", f"step_{steps - 1:06d}", f"step_{steps:06d}"],
                 f"{attempt} kills, {mid_save} of them inside a save; latest after each: "
                 f"{latest_after}; problems {bad}; steps differing {sorted(mismatched)}; "
                 f"at the end {left}")


def expect_refusal(what, cfg, np_ranks, overrides, needles):
    r = trainer(cfg, np_ranks, True, *overrides, check=False)
    text = r.stdout + r.stderr
    found = [n for n in needles if n in text]
    message = next((l for l in text.splitlines() if "error:" in l), "")[:400]
    checks.check(what, r.returncode != 0 and len(found) == len(needles),
                 f"rc {r.returncode}: {message}")


def test_refusals(tmp, cfg, good):
    cases = [("truncated", "rank_00001.h5", "truncated"),
             ("flipped", "rank_00002.h5", "checksum"),
             ("missing", "rank_00003.h5", "missing"),
             ("interrupted", "manifest.txt", "missing")]
    for kind, victim, word in cases:
        bad = os.path.join(tmp, "bad_" + kind)
        shutil.copytree(good, bad)
        path = os.path.join(bad, victim)
        if kind == "truncated":
            os.truncate(path, os.path.getsize(path) - 1000)
        elif kind == "flipped":
            with open(path, "r+b") as f:
                f.seek(os.path.getsize(path) // 2)
                b = f.read(1)
                f.seek(-1, 1)
                f.write(bytes([b[0] ^ 0x10]))
        else:
            os.remove(path)
        expect_refusal(f"{kind} {victim} refused naming it", cfg, 2,
                       [f"--checkpoint.resume={bad}"], [path, word])
    sec = base_sections(tmp, 10, micro_batch=1)
    del sec["init"]
    sec["model"] = {"n_layer": L + 1, "n_head": NH, "d_model": C, "seq_len": T, "vocab_size": V}
    other = write_config(tmp, "other_shape.toml", sec)
    expect_refusal("model shape mismatch names both shapes", other, 2,
                   [f"--checkpoint.resume={good}"],
                   [f"(n_layer {L}, n_head {NH}, d_model {C}, max_seq_len {T}, vocab_size {V})",
                    f"(n_layer {L + 1}, n_head {NH}, d_model {C}, max_seq_len {T}, "
                    f"vocab_size {V})"])


def test_h5py(tmp, rng):
    tokens = make_experiment(tmp, rng, L=L, NH=NH, C=C, T=T, V=V)
    sec = base_sections(tmp, 1, micro_batch=1, lr=0.0)
    sec["checkpoint"] = {"dir": os.path.join(tmp, "ck")}
    cfg = write_config(tmp, "c.toml", sec)
    trainer(cfg, 4, True)
    params, _ = ref.read_model(os.path.join(tmp, "model.bin"))
    P = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    x, y = next(ref.llmc_batches(tokens, GLOBAL_ROWS, T))
    ref.gpt2_loss(P, x, y, L, NH, V).backward()
    ckpt = os.path.join(tmp, "ck", "step_000001")
    f = h5py.File(os.path.join(ckpt, "checkpoint.h5"), "r")
    shapes = dict(ref.param_shapes(L, C, T, ref.padded_vocab(V)))
    names_ok, exact, worst = True, True, 0.0
    for group in ("model", "optim/m", "optim/v"):
        found = {}
        f[group].visititems(lambda n, o: found.__setitem__(n, o.shape)
                            if isinstance(o, h5py.Dataset) else None)
        names_ok &= found == shapes
    for name in shapes:
        exact &= np.array_equal(f["model/" + name][...], params[name].numpy().astype(np.float32))
        g = P[name].grad.numpy()
        for group, want in (("optim/m", 0.1 * g), ("optim/v", 0.05 * g * g)):
            got = f[f"{group}/{name}"][...]
            worst = max(worst, float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30)))
    pad_zero = not f["optim/m/wte"][V:].any() and not f["optim/v/wte"][V:].any()
    checks.check("h5py: names and shapes of model/, optim/m/, optim/v/", names_ok,
                 f"{len(shapes)} tensors each, e.g. model/h.1/attn/qkv/weight "
                 f"{f['model/h.1/attn/qkv/weight'].shape}")
    checks.check("h5py: model/* equals the llm.c file bit for bit after an lr=0 step", exact, "")
    checks.check("h5py: optim/m, optim/v = 0.1 g, 0.05 g^2 (PyTorch float64 g)",
                 worst < 1e-4 and pad_zero, f"max relative error {worst:.2e}")
    config = tomllib.loads(f["config"].asstr()[()])
    meta = (int(f.attrs["step"]), int(f.attrs["format_version"]), int(f.attrs["writers"]),
            int(f["rng"].attrs["seed"]),
            [int(f["data"].attrs[k]) for k in ("epoch", "shard", "row")],
            config["parallel"]["dp"], config["train"]["lr"])
    checks.check("h5py: step, version, writers, seed, data position, config", meta ==
                 (1, 1, 4, 1337, [0, 0, GLOBAL_ROWS], 4, 0.0), f"{meta}")
    f.close()
    dump = subprocess.run(["h5dump", "-d", "/model/ln_f/bias", os.path.join(ckpt, "checkpoint.h5")],
                          capture_output=True, text=True)
    data = re.sub(r"\(\d+\):", " ", dump.stdout.split("DATA {", 1)[-1].split("}", 1)[0])
    values = np.array([float(v) for v in data.replace(",", " ").split()])
    want = params["ln_f/bias"].numpy()
    checks.check("h5dump reads a tensor through the index", dump.returncode == 0 and
                 values.shape == want.shape and np.allclose(values, want, rtol=1e-5, atol=0),
                 f"ln_f/bias: {values.size} values, first {values[:2] if values.size else None}")
    return ckpt


# ---------------------------------------------------------------------------------------------
MOE = {"n_layer": L, "n_head": NH, "d_model": C, "seq_len": T, "vocab_size": V, "n_experts": 4,
       "top_k": 2, "moe_every": 1, "d_expert": 48}


def moe_layout(dp, ep, fsdp=True):
    return [f"--parallel.dp={dp}", f"--parallel.ep={ep}",
            f"--parallel.fsdp={'true' if fsdp else 'false'}",
            f"--train.micro_batch={GLOBAL_ROWS // dp}"]


def moe_expected_shapes(E, D):
    """The expert and router datasets of every block, in every state group."""
    shapes = {}
    for group in ("model", "optim/m", "optim/v"):
        for l in range(L):
            h = f"{group}/h.{l}/mlp/"
            shapes.update({h + "router/weight": (E, C), h + "experts/fc/weight": (E, D, C),
                           h + "experts/proj/weight": (E, C, D), h + "experts/fc/bias": (E, D),
                           h + "experts/proj/bias": (E, C)})
    return shapes


def check_moe_h5py(ckpt):
    f = h5py.File(os.path.join(ckpt, "checkpoint.h5"), "r")
    E, D = MOE["n_experts"], MOE["d_expert"]
    want = moe_expected_shapes(E, D)
    got = {name: f[name].shape for name in want if name in f}
    datasets = []
    f.visititems(lambda n, o: datasets.append(n) if isinstance(o, h5py.Dataset) else None)
    nan = [n for n in datasets if n != "config" and np.isnan(f[n][...]).any()]
    dense_mlp = [n for n in datasets if "/mlp/fc/" in n or "/mlp/proj/" in n]
    attrs = tuple(int(f.attrs[k]) for k in ("format_version", "writer_ep", "n_experts",
                                            "d_expert", "moe_every"))
    f.close()
    checks.check("MoE h5py: experts 3-D (E, D, C), (E, C, D), (E, D), (E, C), router (E, C); "
                 "no NaN; version 2 and the MoE attributes",
                 got == want and not nan and not dense_mlp and attrs == (2, 2, E, D, 1),
                 f"{len(got)} of {len(want)} shapes right, NaN in {nan[:3]}, dense MLP "
                 f"{dense_mlp[:2]}, (version, writer_ep, n_experts, d_expert, moe_every) {attrs}")


def test_moe(tmp, rng):
    make_experiment(tmp, rng, L=L, NH=NH, C=C, T=T, V=V, model=False)
    sec = base_sections(tmp, 6, micro_batch=1)
    del sec["init"]  # an MoE model starts from random init
    sec["model"] = dict(MOE)
    sec["data"]["shuffle"] = True
    cfg = write_config(tmp, "moe.toml", sec)
    ck = os.path.join(tmp, "ck")
    run(cfg, moe_layout(2, 2) + [f"--checkpoint.dir={ck}", "--checkpoint.every=3",
                                 f"--log.metrics={tmp}/ref.jsonl"], np_ranks=2)
    reference, start = losses(f"{tmp}/ref.jsonl"), f"{ck}/step_000003"
    for what, np_ranks, layout_args in (("dp2 x ep2 FSDP", 2, moe_layout(2, 2)),
                                        ("one rank", 1, moe_layout(1, 1, fsdp=False)),
                                        ("dp4 x ep4 FSDP", 4, moe_layout(4, 4))):
        metrics = f"{tmp}/resumed_{np_ranks}.jsonl"
        run(cfg, layout_args + [f"--checkpoint.resume={start}", f"--log.metrics={metrics}"],
            np_ranks=np_ranks)
        got = losses(metrics)
        d = max(abs(got[s] - reference[s]) for s in got) if sorted(got) == [4, 5, 6] else 1.0
        exact = np_ranks == 2
        checks.check(f"MoE dp2 x ep2 FSDP checkpoint resumed at {what}: steps 4-6 " +
                     ("bit-exact" if exact else "within 1e-5"), d == 0 if exact else d < 1e-5,
                     f"steps {sorted(got)}, max |loss - uninterrupted| {d:.2e}")
    check_moe_h5py(start)
    other = dict(MOE, n_experts=8)
    sec["model"] = other
    expect_refusal("MoE: another n_experts names both shapes", write_config(tmp, "e8.toml", sec),
                   1, [f"--checkpoint.resume={start}"],
                   ["n_experts 4, d_expert 48, moe_every 1)", "n_experts 8, d_expert 48"])


def main():
    seed = int(os.environ.get("SEED", np.random.SeedSequence().entropy % (2**32)))
    print(f"test_checkpoint: seed {seed} (SEED={seed} reproduces)")
    rng = np.random.default_rng(seed)
    random.seed(seed)
    torch.manual_seed(seed)
    with tempfile.TemporaryDirectory() as tmp:
        a = os.path.join(tmp, "a")
        os.makedirs(a)
        cfg, fsdp_ck = test_bit_exact(a, rng)
        test_reshard(a, cfg, fsdp_ck)
        test_refusals(a, cfg, os.path.join(fsdp_ck, "step_000010"))
        k = os.path.join(tmp, "kill")
        os.makedirs(k)
        test_kill(k, rng)
        h = os.path.join(tmp, "h5py")
        os.makedirs(h)
        test_h5py(h, rng)
        m = os.path.join(tmp, "moe")
        os.makedirs(m)
        test_moe(m, rng)
    checks.report()


if __name__ == "__main__":
    main()
