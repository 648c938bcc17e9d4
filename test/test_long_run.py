#!/usr/bin/python3
"""test/test_long_run.py - what a long run trips on (beyond the kills, signals and full disks of
test_checkpoint_safety.py and test_preemption.py): files of a checkpoint that are valid on their
own but sit in the wrong place.

Tiny GPT-2 (L=2, NH=3, C=36, T=16, V=101), np = 2 FSDP, global batch 4, saves every 2 steps.
1. Rank files in the wrong place: in step_000004, rank_00000.h5 and rank_00001.h5 swapped, or
   rank_00001.h5 replaced by step_000002's, and the manifest recomputed (as a well-meaning
   repair would): resume refuses before any step, naming the file, the rank or step it was
   written by and the place it sits in. (Before each rank file carried its writer and step,
   both loaded silently: the swap trains from another rank's shard.)
2. Messages that say what is wrong (one rank, random init where no model file is needed):
   - d_model = 1 is refused by the config checks naming [model] d_model and the rule (>= 2);
     d_model = 2 trains (it used to stop with "decayed tensors must come first in a unit");
   - a directory matched by the train glob: "a directory, not a shard" (was "4096 bytes,
     shorter than the 1024-byte header");
   - a Hugging Face directory whose model.safetensors is a directory, at a path of ~2100 bytes
     (the message names it twice, > 4 KiB): "model.safetensors: a directory, not a file", the
     whole message to its last word (messages were cut at 4 KiB, before their cause);
   - [checkpoint] dir 4070 bytes long (a rank file of a save would pass PATH_MAX = 4096):
     refused before the first step with its length, the longest name appended and PATH_MAX,
     the whole message (~4.4 KiB) printed (it used to pass the probe and fail at the first
     save with the cause cut off).
3. Shapes that would exhaust memory, and counts that would run for days, refused before any
   work (in well under a second: the run's wall time is checked < 3 s, on a loaded machine)
   naming the key and, for the shapes, the bytes needed: n_layer 10^6 and 10^8, max_seq_len
   2^31 - 1 (GPT-2, and a Llama's config.json max_position_embeddings), vocab_size 2147483521
   and 2^31 - 1 (the padded vocabulary's byte count overflowed), sample_tokens and val_batches
   2^31 - 1; a FIFO, /dev/urandom and a 2 MiB file as the config file. Past that cheap bound,
   the planner's figures (the step run dry, training/plan.h): a micro-batch whose logits alone
   take twice this host's MemAvailable is refused naming the bytes. (Before: the shapes
   grew to gigabytes and died in bad_alloc naming no key, the counts ran for ever, the FIFO
   and /dev/urandom never returned.)
4. The data set is part of the run's identity: np = 2, shuffle = true, two train shards, saves
   at steps 2 and 4; then between save and resume a shard added, one removed, one rewritten as
   uint32 (the same tokens): resume refuses, naming the file and what changed ("added",
   "removed", "uint16 tokens, now uint32"); with [data] allow_changed = true and a shard added it
   resumes, printing how the position maps, and trains to the end. A shard rewritten as uint32
   while a run reads it stops the run naming the shard ("changed while training"). (Before, all
   five resumed or went on silently: losses up to 0.445 off the uninterrupted run.)
5. One job at a time: four jobs on one checkpoint directory and one metrics file, the same
   command (resume = "latest"), two started together, one 1 s and one 3 s later, waiting at
   most 1 s for a lock: exactly one trains (until SIGUSR1 stops it with a checkpoint), with
   every step once in the metrics file, every checkpoint valid and `latest` its last; each other one stops before any step naming the
   holder (this host, "pid"). Then a job killed with kill -9 of mpirun alone (its ranks live on
   for a moment) and resumed at once: the resume starts only when every rank of the killed job
   is gone (checked by watching their processes), and ends with each step once in the
   metrics file, every checkpoint valid and `latest` its own. (Before, all four trained into
   the one directory, overwriting each other's checkpoints and records.)
"""
import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt2_reference import write_shard  # noqa: E402
from trainer import (MPIRUN, TRAIN_CPU, Checks, base_sections, json_records,  # noqa: E402
                     kill_job, learnable_tokens, make_experiment, rank_pids, run, seeded_rng,
                     verify_manifest, write_config)

checks = Checks("test_long_run")
L, NH, C, T, V = 2, 3, 36, 16, 101
LAYOUT = ["--parallel.dp=2", "--parallel.fsdp=true", "--train.micro_batch=2"]


def trainer(cfg, ck, metrics, *extra, np_ranks=2, check=False, timeout=120):
    return run(cfg, (LAYOUT if np_ranks else []) + [f"--checkpoint.dir={ck}",
                                                    f"--log.metrics={metrics}", *extra],
               np_ranks=np_ranks, check=check, timeout=timeout)


def step_lines(out):
    return [l for l in out.splitlines() if l.startswith("step ") and "| loss" in l]


def error_line(p):
    return next((l for l in (p.stderr + p.stdout).splitlines() if "error" in l), "no error line")


def rewrite_manifest(ckpt):
    """The manifest recomputed over the files as they are now (a repair that trusts them)."""
    with open(os.path.join(ckpt, "manifest.txt")) as f:
        lines = f.read().splitlines()
    text = lines[0] + "\n"
    for line in lines[1:-1]:
        name = line.split()[2]
        data = open(os.path.join(ckpt, name), "rb").read()
        text += f"{len(data)} {zlib.crc32(data):08x} {name}\n"
    text += f"end {zlib.crc32(text.encode()):08x}\n"
    with open(os.path.join(ckpt, "manifest.txt"), "w") as f:
        f.write(text)


def test_misplaced_rank_files(tmp, cfg):
    original = os.path.join(tmp, "ck_misplaced")
    trainer(cfg, original, os.path.join(tmp, "misplaced.jsonl"), "--train.steps=4", check=True)

    def damaged(name, damage, words):
        ck = os.path.join(tmp, name)
        shutil.copytree(original, ck)
        damage(os.path.join(ck, "step_000004"))
        rewrite_manifest(os.path.join(ck, "step_000004"))
        p = trainer(cfg, ck, os.path.join(tmp, name + "_resumed.jsonl"), "--train.steps=6",
                    "--checkpoint.resume=latest")
        text = p.stdout + p.stderr
        ok = p.returncode != 0 and all(w in text for w in words) and not step_lines(p.stdout)
        checks.check(f"{name}: resume refused naming {words}", ok,
                     f"exit {p.returncode}: {error_line(p)[:260]}")

    def swap(d):
        a, b = os.path.join(d, "rank_00000.h5"), os.path.join(d, "rank_00001.h5")
        os.rename(a, a + ".x")
        os.rename(b, a)
        os.rename(a + ".x", b)
    damaged("swapped_rank_files", swap, ["rank_00000.h5", "written by rank 1"])
    damaged("rank_file_of_another_step", lambda d: shutil.copyfile(
        os.path.join(d, "..", "step_000002", "rank_00001.h5"), os.path.join(d, "rank_00001.h5")),
        ["rank_00001.h5", "written at step 2", "step 4"])


def model_sections(tmp, steps=2, **model):
    shape = {"n_layer": 1, "n_head": 1, "d_model": 2, "seq_len": 8, "vocab_size": V}
    shape.update(model)
    sec = base_sections(tmp, steps, micro_batch=2)
    del sec["init"]
    sec["model"] = shape
    return sec


def refused(tmp, what, sec, words, last_words=None):
    p = run(write_config(tmp, "bad.toml", sec), check=False, timeout=60)
    text = p.stdout + p.stderr
    whole = last_words is None or p.stderr.rstrip().endswith(last_words)
    ok = p.returncode != 0 and all(w in text for w in words) and whole and \
        not step_lines(p.stdout)
    checks.check(f"refused: {what}", ok, f"exit {p.returncode}, ends whole {whole}: "
                 f"{error_line(p)[:200]} ... {p.stderr.rstrip()[-80:]}")


def deep_dir(tmp, length):
    """A directory whose path is `length` bytes (components of <= 200 bytes)."""
    path = tmp
    while len(path) < length:
        path = os.path.join(path, "d" * min(200, length - len(path) - 1))
    os.makedirs(path, exist_ok=True)
    assert len(path) == length, len(path)
    return path


def test_messages(tmp):
    refused(tmp, "d_model = 1", model_sections(tmp, d_model=1), ["[model] d_model", ">= 2"])
    p = run(write_config(tmp, "d2.toml", model_sections(tmp, d_model=2)), check=False, timeout=60)
    checks.check("d_model = 2 trains", p.returncode == 0 and len(step_lines(p.stdout)) == 2,
                 f"exit {p.returncode}: {error_line(p)[:200]}")

    os.makedirs(os.path.join(tmp, "train_dir.bin"))
    refused(tmp, "a directory among the shards", base_sections(tmp, 2),
            [os.path.join(tmp, "train_dir.bin"), "a directory, not a shard"])
    os.rmdir(os.path.join(tmp, "train_dir.bin"))

    hf = deep_dir(tmp, 2100)
    with open(os.path.join(hf, "config.json"), "w") as f:
        json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                   "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
                   "num_key_value_heads": 2, "intermediate_size": 16, "vocab_size": V,
                   "max_position_embeddings": 16, "tie_word_embeddings": False}, f)
    os.makedirs(os.path.join(hf, "model.safetensors"))
    sec = model_sections(tmp)
    sec["model"] = {"seq_len": 8, "arch": "llama"}
    sec["init"] = {"from": hf}
    refused(tmp, "model.safetensors a directory, the message > 4 KiB",
            sec, ["model.safetensors: a directory, not a file"],
            last_words="a directory, not a file (a safetensors file was expected)")

    ck = deep_dir(tmp, 4070)
    sec = model_sections(tmp, steps=4)
    sec["checkpoint"] = {"dir": ck, "every": 2}
    refused(tmp, "a checkpoint dir too long for its rank files", sec,
            ["is too long", "4070 bytes", "PATH_MAX = 4096", "step_000004.tmp/rank_00000.h5"],
            last_words="choose a dir of at most 4065 bytes")


def refused_fast(tmp, what, sec, words, config=None, timeout=20):
    t0 = time.time()
    try:
        p = run(config or write_config(tmp, "big.toml", sec), check=False, timeout=timeout)
    except subprocess.TimeoutExpired:
        checks.check(f"refused fast: {what}", False, f"still running after {timeout} s")
        return
    took = time.time() - t0
    text = p.stdout + p.stderr
    ok = p.returncode != 0 and all(w in text for w in words) and took < 3 and \
        not step_lines(p.stdout)
    checks.check(f"refused fast: {what}", ok, f"exit {p.returncode} in {took:.2f} s: "
                 f"{error_line(p)[:240]}")


def test_sizes(tmp):
    big = 2**31 - 1
    gpt = dict(n_layer=2, n_head=3, d_model=36)
    for what, model, words in (
            ("n_layer 1e6", dict(gpt, n_layer=10**6), ["[model] n_layer = 1000000", "bytes"]),
            ("n_layer 1e8", dict(gpt, n_layer=10**8), ["[model] n_layer = 100000000", "bytes"]),
            ("max_seq_len 2^31-1", dict(gpt, max_seq_len=big),
             ["[model] max_seq_len = 2147483647", "bytes"]),
            ("vocab_size 2147483521", dict(gpt, vocab_size=2147483521),
             ["[model] vocab_size = 2147483521", "2147483520"]),
            ("vocab_size 2^31-1", dict(gpt, vocab_size=big), ["[model] vocab_size", "2147483520"])):
        refused_fast(tmp, what, model_sections(tmp, **model), words)
    hf = os.path.join(tmp, "hf_long")
    os.makedirs(hf, exist_ok=True)
    with open(os.path.join(hf, "config.json"), "w") as f:
        json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                   "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                   "num_key_value_heads": 4, "intermediate_size": 128, "vocab_size": V,
                   "max_position_embeddings": big, "tie_word_embeddings": False}, f)
    sec = model_sections(tmp)
    sec["model"] = {"seq_len": 8, "arch": "llama", "d_model": 64}
    sec["init"] = {"from": hf}
    refused_fast(tmp, "Llama config.json max_position_embeddings 2^31-1", sec,
                 ["[model] max_seq_len = 2147483647", "rotary tables", "bytes"])
    # Past the cheap bound, the planner's figures: a micro-batch whose step needs twice this
    # host's available memory (the bytes per row measured with --plan at 1000 rows).
    available = int(next(l for l in open("/proc/meminfo") if l.startswith("MemAvailable"))
                    .split()[1]) * 1024
    sec = model_sections(tmp, vocab_size=50257, seq_len=8, **gpt)
    sec["train"]["micro_batch"] = 1000
    out = run(write_config(tmp, "plan1000.toml", sec), ["--plan"], timeout=60).stdout
    peak_mib = float(out.split("device MiB\n")[1].split()[7])
    rows = int(2 * available / (peak_mib * 2**20 / 1000)) + 1
    sec["train"]["micro_batch"] = rows
    refused_fast(tmp, f"micro_batch {rows} (the planner's peak)", sec,
                 ["run dry by the planner", "bytes", "of host memory"])
    for key, words in (("sample_tokens", ["[log] sample_tokens", "<= 65536"]),
                       ("val_batches", ["[log] val_batches", "<= 1000000"])):
        sec = model_sections(tmp)
        sec["log"][key] = big
        refused_fast(tmp, f"{key} 2^31-1", sec, words)
    fifo = os.path.join(tmp, "fifo.toml")
    os.mkfifo(fifo)
    refused_fast(tmp, "a FIFO as the config", None, ["fifo.toml", "not a regular file"],
                 config=fifo, timeout=10)
    refused_fast(tmp, "/dev/urandom as the config", None, ["not a regular file"],
                 config="/dev/urandom", timeout=10)
    huge = os.path.join(tmp, "huge.toml")
    with open(huge, "w") as f:
        f.write("# padding\n" * 200000)
    refused_fast(tmp, "a 2 MiB config", None, ["huge.toml", "more than the 1048576"],
                 config=huge, timeout=10)


def test_changed_data(tmp, rng):
    d = os.path.join(tmp, "changed")
    os.makedirs(d)
    tokens = [learnable_tokens(rng, 1500, V) for _ in range(3)]
    for i in range(2):
        write_shard(os.path.join(d, f"train_00{i}.bin"), tokens[i], 1)
    sec = base_sections(tmp, 6, micro_batch=2)
    sec["data"] = {"train": os.path.join(d, "train_*.bin"), "shuffle": True}
    sec["checkpoint"] = {"every": 2}
    cfg = write_config(tmp, "changed.toml", sec)
    original = os.path.join(tmp, "ck_changed")
    trainer(cfg, original, os.path.join(tmp, "changed.jsonl"), "--train.steps=4", check=True)
    saved = {f: open(os.path.join(d, f), "rb").read() for f in os.listdir(d)}

    def resumed(name, change, words, allow=False, code=1):
        for f in os.listdir(d):
            os.remove(os.path.join(d, f))
        for f, data in saved.items():
            open(os.path.join(d, f), "wb").write(data)
        change()
        ck = os.path.join(tmp, "ck_" + name)
        shutil.copytree(original, ck)
        m = os.path.join(tmp, name + ".jsonl")
        p = trainer(cfg, ck, m, "--train.steps=6", "--checkpoint.resume=latest",
                    *(["--data.allow_changed=true"] if allow else []))
        text = p.stdout + p.stderr
        steps = len(step_lines(p.stdout))
        ok = p.returncode == code and all(w in text for w in words) and \
            steps == (2 if code == 0 else 0)
        checks.check(f"data {name}: {'continues' if code == 0 else 'resume refused'} naming "
                     f"{words}", ok, f"exit {p.returncode}, {steps} steps: "
                     f"{(error_line(p) if code else next((l for l in p.stdout.splitlines() if 'data position' in l), ''))[:300]}")

    shard = lambda i: os.path.join(d, f"train_00{i}.bin")  # noqa: E731
    resumed("added", lambda: write_shard(shard(2), tokens[2], 1), ["added:", shard(2)])
    resumed("removed", lambda: os.remove(shard(1)), ["removed:", shard(1)])
    resumed("uint32", lambda: write_shard(shard(1), tokens[1], 7),
            ["changed:", shard(1), "uint16 tokens, now uint32"])
    resumed("added_allowed", lambda: write_shard(shard(2), tokens[2], 1),
            ["added:", shard(2), "data position (epoch 0, shard"], allow=True, code=0)

    # Rewritten while a run reads it: the next read of the shard stops the run.
    for f, data in saved.items():
        open(os.path.join(d, f), "wb").write(data)
    p = subprocess.Popen([TRAIN_CPU, cfg, "--train.steps=100000",
                          f"--log.metrics={tmp}/midrun.jsonl"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    for line in p.stdout:
        if line.startswith("step "):
            break
    for i in range(2):
        write_shard(shard(i) + ".new", tokens[i], 7)
        os.rename(shard(i) + ".new", shard(i))
    try:
        out, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
    ok = p.returncode not in (0, None, -9) and "changed while training" in err and "uint32" in err
    checks.check("a shard rewritten as uint32 mid-run stops the run naming it", ok,
                 f"exit {p.returncode}: {(err.strip().splitlines() or ['no error'])[-1][:260]}")


def lock_sections(tmp, d, steps):
    sec = base_sections(tmp, steps, micro_batch=2)
    sec["checkpoint"] = {"dir": d, "every": 50, "resume": "latest", "lock_wait_s": 1}
    sec["log"]["metrics"] = d + ".jsonl"
    return write_config(tmp, os.path.basename(d) + ".toml", sec)


def launch(cfg, *extra):
    return subprocess.Popen([*MPIRUN, "-np", "2", TRAIN_CPU, cfg, *LAYOUT, *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env=dict(os.environ, OMP_NUM_THREADS="1"))


def steps_once(metrics, last):
    seen = [r["step"] for r in json_records(metrics) if "loss" in r and "val_loss" not in r]
    return sorted(seen) == list(range(1, last + 1)), len(seen)


def all_valid(d):
    bad = [s for s in glob.glob(os.path.join(d, "step_*")) if verify_manifest(s)]
    return not bad and not glob.glob(os.path.join(d, "*.tmp"))


def test_two_jobs(tmp):
    d = os.path.join(tmp, "ck_two_jobs")
    cfg = lock_sections(tmp, d, 100000)  # the winner trains until told to stop (SIGUSR1)
    jobs = [launch(cfg), launch(cfg)]
    time.sleep(1)
    jobs.append(launch(cfg))
    time.sleep(2)
    jobs.append(launch(cfg))
    deadline = time.time() + 60
    while time.time() < deadline and sum(j.poll() is None for j in jobs) > 1:
        time.sleep(0.05)
    for j in jobs:
        if j.poll() is None:
            os.kill(j.pid, signal.SIGUSR1)  # mpirun forwards it: a checkpoint, then exit 75
    outs = [j.communicate(timeout=120) for j in jobs]
    won = [i for i, j in enumerate(jobs) if j.returncode == 75]
    host = socket.gethostname()
    refused = [i for i, (o, e) in enumerate(outs) if jobs[i].returncode == 1 and
               "is in use by another job" in e and host in e and "pid" in e and
               not step_lines(o)]
    last = max([r["step"] for r in json_records(d + ".jsonl") if "loss" in r] or [0])
    once, n = steps_once(d + ".jsonl", last)
    ok = len(won) == 1 and len(refused) == 3 and once and last > 0 and all_valid(d) and \
        open(os.path.join(d, "latest")).read() == f"step_{last:06d}\n"
    detail = next((l for i, (o, e) in enumerate(outs) if i in refused for l in e.splitlines()
                   if "in use" in l), "no refusal")
    checks.check("four jobs on one directory (0, 0, 1, 3 s): one trains, three refused naming "
                 "the holder", ok, f"exits {[j.returncode for j in jobs]}, {n} step records to "
                 f"step {last}, each once {once}: {detail[:240]}")


def alive(pid):
    """Running (not gone, and not a zombie: a zombie has closed its files and writes nothing)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def test_resume_after_kill(tmp):
    d = os.path.join(tmp, "ck_killed")
    steps = 60
    cfg = lock_sections(tmp, d, steps)
    old = launch(cfg, "--checkpoint.every=1")
    marker = os.path.basename(d) + ".toml"
    deadline = time.time() + 120
    while time.time() < deadline and not os.path.exists(os.path.join(d, "step_000004")):
        time.sleep(0.05)
    old_ranks = set(rank_pids(marker).values())
    os.kill(old.pid, signal.SIGKILL)  # mpirun alone: its ranks live on for a moment
    killed_at = time.time()
    new = launch(cfg, "--checkpoint.lock_wait_s=60")
    stamped = []  # (time, line) of the new job's stdout

    def read():
        for line in new.stdout:
            stamped.append((time.time(), line))
    reader = threading.Thread(target=read)
    reader.start()
    gone_at = None
    while gone_at is None and time.time() < killed_at + 60:
        if not any(alive(pid) for pid in old_ranks):
            gone_at = time.time()
        time.sleep(0.01)
    new.wait(timeout=180)
    reader.join()
    err = new.stderr.read()
    kill_job(old, marker)
    once, n = steps_once(d + ".jsonl", steps)
    took = next((t for t, l in stamped if "taking over" in l), None)
    after = took is not None and gone_at is not None and took >= gone_at - 0.05
    ok = new.returncode == 0 and once and after and all_valid(d) and \
        open(os.path.join(d, "latest")).read() == f"step_{steps:06d}\n"
    lines = [l.strip() for t, l in stamped if l.startswith("lock ")]
    checks.check("resume right after kill -9 of mpirun: starts after the old ranks are gone, "
                 "each step once", ok,
                 f"exit {new.returncode}, {len(old_ranks)} old ranks gone "
                 f"{(gone_at or 0) - killed_at:.2f} s after the kill, lock taken "
                 f"{(took or 0) - killed_at:.2f} s after, {n} step records, each once {once}: "
                 f"{lines[:2]} {err.strip()[-200:]}")


def main():
    rng = seeded_rng("test_long_run")
    with tempfile.TemporaryDirectory() as tmp:
        make_experiment(tmp, rng, L=L, NH=NH, C=C, T=T, V=V, n_tokens=2000)
        sec = base_sections(tmp, 8, micro_batch=2)
        sec["checkpoint"] = {"every": 2}
        cfg = write_config(tmp, "c.toml", sec)
        checks.run_each(lambda: test_misplaced_rank_files(tmp, cfg),
                        lambda: test_messages(tmp), lambda: test_sizes(tmp),
                        lambda: test_changed_data(tmp, rng), lambda: test_two_jobs(tmp),
                        lambda: test_resume_after_kill(tmp))
    checks.report()


if __name__ == "__main__":
    main()
