#!/usr/bin/python3
"""test/test_config.py - the config loader (config/config.cu) end to end, through a binary.

Runs the binary named by env CONFIG_BIN (default ./train_cpu; may hold extra words, e.g.
"mpirun -n 1 ./train_cpu") as [bin..., config.toml, overrides..., "--check-config"] on configs
generated in a temp dir (with tiny llm.c token shards for the globs and tiny llm.c model files for
[init] from), at world size 1 (env WORLD_SIZE=1 for the stand-in driver test/config_main.cpp).

Every error case asserts: exit status 1, one message starting "error: " that names the key, and
its file:line:col with the right line (or the override text), with no source location of ours
(".cu:", ".cpp:") and no MPI_ABORT banner. The good configs assert exit
status 0, that the printed resolved TOML parses (tomllib) to exactly the expected keys and values
(defaults from config/config.h, the file, the overrides; floats compared as float32), and that
feeding the printed text back in prints the same text again (round trip).
Every shipped config (configs/*.toml) passes --check-config, with its data globs pointed at a
shard long enough for its first batch and its parallel degrees at 1 (the layout is the
planner's: test/test_plan.py, test/test_mfu.py), and its printed config round-trips.
"""
import os
import shlex
import struct
import subprocess
import sys
import tempfile
import time
import tomllib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import Filter  # noqa: E402

BIN = shlex.split(os.environ.get("CONFIG_BIN", "./train_cpu"))
FAILURES = []
CHECKS = [0]
ONLY = Filter()

# The defaults of config/config.h; "model" keys have none (required unless [init] from).
DEFAULTS = {
    "model": {},
    "init": {"from": ""},
    "data": {"train": None, "weights": [], "val": "", "shuffle": False, "tokenizer": "", "allow_changed": False,
             "document_mask": False, "eot_token": 50256, "document_positions": True},
    "train": {"micro_batch": 4, "grad_accum": 1, "steps": None, "lr": 3e-4, "warmup_steps": 0,
              "lr_schedule": "cosine", "min_lr": 0.0, "weight_decay": 0.0, "grad_clip": 1.0,
              "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "seed": 1337, "recompute": "none",
              "moe_aux_loss": 0.01, "moe_z_loss": 0.0, "moe_balance": "aux_loss",
              "moe_bias_rate": 0.001, "moe_capacity_factor": 0.0, "skip_spikes": 0.0, "max_skips": 5,
              "optimizer_offload": "none", "offload_dir": ""},
    "parallel": {"dp": 1, "tp": 1, "pp": 1, "cp": 1, "cp_comm": "ring", "cp_a2a": 0, "ep": 1,
                 "sp": True, "tp_overlap": False, "zero": 0,
                 "fsdp": False, "pp_schedule": "1f1b", "pp_virtual": 1, "pp_layers": [],
                 "pp_balance": "equal", "backend": "", "timeout_s": 600.0,
                 "grad_compression": "none", "topk_ratio": 0.01, "dp_replicate": 1, "reduce_dtype": "fp32",
                 "bucket_mb": 0.0, "fsdp_prefetch": 1,
                 "diloco_islands": 0,
                 "diloco_every": 50, "diloco_outer_lr": 0.7, "diloco_outer_momentum": 0.9,
                 "diloco_compression": "none"},
    "precision": {"compute": "fp32", "fp8_recipe": "tensorwise", "fp8_amax_history": 16,
                  "fp8_margin": 0},
    "kernels": {"attention": "auto", "cuda_graph": "off"},
    "checkpoint": {"dir": "", "every": 0, "keep": 3, "resume": "", "overwrite": False,
                   "async": False, "lock_wait_s": 10},
    "log": {"every": 1, "metrics": "", "val_every": 0, "val_batches": 10, "sample_every": 0,
            "sample_tokens": 64, "peak_tflops": 0.0, "pipeline_timeline": False,
            "check_tied": False, "check_replicas": False, "straggler_every": 100,
            "straggler_factor": 1.25, "grad_noise_scale": False, "trace": "",
            "trace_steps": [2, 2], "sample_temperature": 1.0,
            "sample_top_k": 0, "sample_kv_cache": True},
    "eval": {"file": "", "every": 0, "examples": 0},
    "plan": {"device": "H100 SXM", "peak_tflops": 0.0, "matmul_efficiency": 0.6, "hbm_gbs": 3350.0,
             "intra_node_gbs": 450.0, "inter_node_gbs": 50.0, "gpus_per_node": 8,
             "memory_gib": 80.0, "pcie_gbs": 50.0, "nvme_gbs": 6.0},
}
MODEL_KEYS = ["n_layer", "n_head", "d_model", "seq_len", "vocab_size"]  # required
# max_seq_len defaults to seq_len or maxT; the mixture-of-experts keys to a dense model's values
PRINTED_MODEL_KEYS = MODEL_KEYS + ["max_seq_len", "n_experts", "top_k", "moe_every", "d_expert",
                                   "n_shared_experts", "router_score", "arch", "n_kv_head", "d_ff", "rope_theta", "norm_eps",
                                   "tie_embeddings"]
FLOAT32_KEYS = {"lr", "min_lr", "weight_decay", "grad_clip", "beta1", "beta2", "eps",
                "moe_aux_loss", "moe_z_loss", "moe_bias_rate", "moe_capacity_factor", "skip_spikes",
                "straggler_factor"}


def check(ok, what):
    if not ONLY.counts(what):  # TEST_ONLY (test/checks.py): only the checks it names
        return
    CHECKS[0] += 1
    if not ok:
        FAILURES.append(what)
        print("FAIL:", what)


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


# ----------------------------------------------------------------------------------------------
# Files: llm.c token shards and model files


def write_shard(path, ntok=600):  # enough rows for every config's first batch (--check-config)
    header = [0] * 256
    header[0:3] = [20240520, 1, ntok]
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header) + struct.pack(f"<{ntok}H", *range(ntok)))


def write_model(path, L=2, NH=2, C=8, maxT=16, V=100, version=3, magic=20240326, cut=0):
    Vp = (V + 127) // 128 * 128
    params = Vp * C + maxT * C + L * (12 * C * C + 13 * C) + 2 * C
    header = [0] * 256
    header[0:8] = [magic, version, maxT, V, L, NH, C, Vp]
    body = bytes(params * (4 if version == 3 else 2))
    with open(path, "wb") as f:
        f.write((struct.pack("<256i", *header) + body)[: len(body) + 1024 - cut])


# ----------------------------------------------------------------------------------------------
# Configs: a base config, edited per case; the positions of every key are returned


def base_sections(tmp):
    return [
        ("model", [("n_layer", "2"), ("n_head", "2"), ("d_model", "8"), ("seq_len", "16"),
                   ("vocab_size", "100")]),
        ("data", [("train", f'"{tmp}/train_*.bin"')]),
        ("train", [("steps", "10"), ("lr", "1e-3")]),
    ]


def render(sections, edits=None, head=""):
    """edits: {"section.key": value text, or None to delete}; new keys/sections are appended.
    Returns (text, {"section.key": (line, key_col, value_col)}, {"section": line})."""
    sections = [(s, list(kv)) for s, kv in sections]
    for dotted, value in (edits or {}).items():
        sec, key = dotted.split(".", 1)
        entry = next((kv for s, kv in sections if s == sec), None)
        if entry is None:
            entry = []
            sections.append((sec, entry))
        idx = next((i for i, (k, _) in enumerate(entry) if k == key), None)
        if value is None:
            entry.pop(idx)
        elif idx is None:
            entry.append((key, value))
        else:
            entry[idx] = (key, value)
    lines = head.splitlines()
    keys, headers = {}, {}
    for sec, kv in sections:
        lines.append(f"[{sec}]")
        headers[sec] = len(lines)
        for key, value in kv:
            line = f"{key} = {value}"
            lines.append(line)
            keys[f"{sec}.{key}"] = (len(lines), 1, line.index("= ") + 3)
        lines.append("")
    return "\n".join(lines) + "\n", keys, headers


class Case:
    counter = [0]

    def __init__(self, tmp):
        self.tmp = tmp

    def write(self, text):
        Case.counter[0] += 1
        path = os.path.join(self.tmp, f"case{Case.counter[0]}.toml")
        with open(path, "w") as f:
            f.write(text)
        return path


def run(path, overrides=()):
    env = dict(os.environ, WORLD_SIZE="1")
    p = subprocess.run(BIN + [path, *overrides, "--check-config"], capture_output=True,
                       text=True, env=env, timeout=60)
    return p.returncode, p.stdout, p.stderr


def expect_error(name, path, overrides=(), names=(), at=()):
    """`names`: strings the message must contain; `at`: (line, col) or (line,) locations in
    `path` the message must give."""
    rc, _, err = run(path, overrides)
    check(rc == 1, f"{name}: expected exit status 1, got {rc}\n{err}")
    check(err.startswith("error: ") and err.count("\nerror: ") == 0 and "Error" not in err,
          f"{name}: expected one message starting with 'error: ':\n{err}")
    check(".cu:" not in err and ".cpp:" not in err and "MPI_ABORT" not in err,
          f"{name}: a source location of ours or MPI's abort banner in the message:\n{err}")
    for s in names:
        check(s in err, f"{name}: message does not name {s!r}:\n{err}")
    for loc in at:
        want = f"{path}:" + ":".join(str(x) for x in loc) + (":" if len(loc) == 1 else "")
        check(want in err, f"{name}: message does not give the location {want}:\n{err}")


def expect_good(name, path, overrides=(), expected=None):
    """Exit 0; the printed TOML has every key with the expected values; it round-trips."""
    if not ONLY.wanted(name):
        return None
    rc, out, err = run(path, overrides)
    check(rc == 0, f"{name}: exit status {rc}\n{err}")
    if rc != 0:
        return None
    try:
        got = tomllib.loads(out)
    except tomllib.TOMLDecodeError as e:
        check(False, f"{name}: printed config is not TOML ({e}):\n{out}")
        return None
    for sec, keys in DEFAULTS.items():
        want_keys = set(PRINTED_MODEL_KEYS) if sec == "model" else set(keys)
        check(set(got.get(sec, {})) == want_keys,
              f"{name}: [{sec}] printed keys {sorted(got.get(sec, {}))} != {sorted(want_keys)}")
    check(list(got) == list(DEFAULTS), f"{name}: section order {list(got)}")
    for dotted, want in (expected or {}).items():
        sec, key = dotted.split(".")
        have = got.get(sec, {}).get(key)
        if key in FLOAT32_KEYS:
            same = isinstance(have, float) and f32(have) == f32(want)
        else:
            same = have == want and type(have) is type(want)
        check(same, f"{name}: [{sec}] {key} = {have!r}, expected {want!r}")
    resolved = os.path.join(os.path.dirname(path), f"resolved_{os.path.basename(path)}")
    with open(resolved, "w") as f:
        f.write(out)
    rc2, out2, err2 = run(resolved)
    check(rc2 == 0 and out2 == out, f"{name}: the printed config does not round-trip "
          f"(status {rc2}):\n{err2}\n--- first ---\n{out}\n--- again ---\n{out2}")
    return got


def full_expected(overrides):
    """Every key's expected value: the defaults with `overrides` ({"section.key": value})."""
    want = {f"{s}.{k}": v for s, kv in DEFAULTS.items() for k, v in kv.items() if v is not None}
    want["parallel.backend"] = "mpi"  # ./train_cpu's default, and the stand-in driver's
    want.update(overrides)
    return want


# ----------------------------------------------------------------------------------------------
# Cases


def good_cases(tmp):
    c = Case(tmp)
    secs = base_sections(tmp)
    text, _, _ = render(secs)
    path = c.write(text)
    # Awkward floats (many digits) catch a resolved text that rounds them.
    overrides = ["--train.lr=6.12345e-4", "--data.shuffle=true", "--checkpoint.dir=out/run",
                 "--train.seed=42", '--log.metrics="m.jsonl"', "--parallel.fsdp=true",
                 "--train.recompute=gelu", "--log.peak_tflops=989.4321987654321",
                 "--train.min_lr=3e-5", "--train.beta2=0.987654", "--train.steps=20",
                 f"--data.val={tmp}/val_*.bin",
                 "--log.val_every=5", "--checkpoint.resume=latest", "--train.eps=1e-10",
                 "--precision.compute=bf16", "--kernels.attention=flash", "--train.grad_clip=0"]
    want = full_expected({
        "model.n_layer": 2, "model.n_head": 2, "model.d_model": 8, "model.seq_len": 16,
        "model.max_seq_len": 16, "model.vocab_size": 100, "data.train": f"{tmp}/train_*.bin",
        "train.lr": 6.12345e-4,
        "data.shuffle": True, "checkpoint.dir": "out/run", "train.seed": 42,
        "log.metrics": "m.jsonl", "parallel.fsdp": True, "parallel.zero": 3,
        "train.recompute": "gelu",
        "log.peak_tflops": 989.4321987654321, "train.min_lr": 3e-5, "train.beta2": 0.987654,
        "train.steps": 20,
        "data.val": f"{tmp}/val_*.bin", "log.val_every": 5, "checkpoint.resume": "latest",
        "train.eps": 1e-10, "precision.compute": "bf16", "kernels.attention": "flash",
        "train.grad_clip": 0.0})
    expect_good("good config + overrides (fsdp with dp=1 is a no-op)", path, overrides, want)

    # An integer literal is fine for a float key; every key set in the file; odd strings.
    text, _, _ = render(secs, {"train.lr": "1", "train.weight_decay": "0.1",
                               "data.tokenizer": '"' + tmp + r'/tok \"q\" \\ é.bin"',
                               "parallel.backend": '"nccl"', "checkpoint.keep": "1"})
    got = expect_good("integer literal for a float key", c.write(text), (), {
        "train.lr": 1.0, "train.weight_decay": 0.1, "data.tokenizer": tmp + '/tok "q" \\ é.bin',
        "parallel.backend": "nccl", "checkpoint.keep": 1})

    # [init] from gives the shape (fp32 v3 and bf16 v5 files); given keys that agree are fine.
    for version in (3, 5):
        model = os.path.join(tmp, f"model_v{version}.bin")
        write_model(model, L=3, NH=4, C=16, maxT=32, V=300, version=version)
        text, _, _ = render(secs, {f"model.{k}": None for k in MODEL_KEYS} |
                            {"init.from": f'"{model}"'})
        expect_good(f"shape from an llm.c v{version} model file", c.write(text), (), {
            "model.n_layer": 3, "model.n_head": 4, "model.d_model": 16, "model.seq_len": 32,
            "model.max_seq_len": 32, "model.vocab_size": 300, "init.from": model})
        text, _, _ = render(secs, {"model.n_layer": "3", "model.n_head": None,
                                   "model.d_model": "16", "model.seq_len": None,
                                   "model.vocab_size": "300", "init.from": f'"{model}"'})
        expect_good(f"agreeing [model] keys with a v{version} model file", c.write(text), (),
                    {"model.n_layer": 3, "model.n_head": 4})
        # A shorter seq_len than the file's maxT: the run uses the first seq_len rows of wpe.
        text, _, _ = render(secs, {f"model.{k}": None for k in MODEL_KEYS} |
                            {"init.from": f'"{model}"', "model.seq_len": "8"})
        expect_good(f"seq_len 8 < maxT 32 of a v{version} model file", c.write(text), (),
                    {"model.seq_len": 8, "model.max_seq_len": 32, "model.n_layer": 3})
    # Random init: max_seq_len sizes the position table, seq_len is trained at.
    text, _, _ = render(secs, {"model.max_seq_len": "64"})
    expect_good("random init with max_seq_len 64 > seq_len 16", c.write(text), (),
                {"model.seq_len": 16, "model.max_seq_len": 64})


def file_error_cases(tmp):
    c = Case(tmp)
    secs = base_sections(tmp)

    def case(name, edits, names, key=None, col="value", head=""):
        text, keys, _ = render(secs, edits, head)
        path = c.write(text)
        at = ()
        if key:
            line, key_col, value_col = keys[key]
            at = ((line, value_col if col == "value" else key_col),)
        expect_error(name, path, (), names, at)

    # Parse errors: toml::parse_error's description and line:col.
    text, keys, _ = render(secs, {"train.lr": "= 3"})
    expect_error("parse error", c.write(text), (), ["TOML parse error"], ((keys["train.lr"][0],),))
    text, keys, _ = render(secs)
    text = text.replace("lr = 1e-3\n", "lr = 1e-3\nlr = 2e-3\n")
    expect_error("duplicate key", c.write(text), (), ["lr"], ((keys["train.lr"][0] + 1,),))

    # Unknown sections and keys, wrong types.
    text, _, headers = render(secs, {"trian.lr": "1"})
    expect_error("unknown section", c.write(text), (), ["[trian]", "unknown section"],
                 ((headers["trian"], 2),))
    text, _, _ = render(secs, head="lr = 1")
    expect_error("key outside any section", c.write(text), (), ["'lr'", "outside"], ((1, 1),))
    text, _, _ = render(secs, head="precision = 5")
    expect_error("section that is not a table", c.write(text), (), ["[precision]", "table"],
                 ((1, 1),))
    case("unknown key", {"train.lrr": "1"}, ["lrr", "[train]", "unknown key"], "train.lrr", "key")
    case("sub-table in a section", {"train.opt": "{ a = 1 }"}, ["'opt'"], "train.opt", "key")
    case("int for a string key", {"precision.compute": "16"}, ["compute", "expects a string"],
         "precision.compute")
    case("float for an int key", {"train.steps": "10.5"}, ["steps", "expects an integer"],
         "train.steps")
    case("string for a float key", {"train.lr": '"abc"'}, ["lr", "expects a number"], "train.lr")
    case("int for a bool key", {"data.shuffle": "1"}, ["shuffle", "true or false"], "data.shuffle")
    case("array for an int key", {"parallel.dp": "[1, 2]"}, ["dp", "an array"], "parallel.dp")
    case("int out of range", {"train.steps": "3000000000"}, ["steps", "out of range"],
         "train.steps")
    case("negative seed", {"train.seed": "-1"}, ["seed", "out of range"], "train.seed")
    case("nan lr", {"train.lr": "nan"}, ["lr", "finite"], "train.lr")
    case("float overflow", {"train.eps": "1e300"}, ["eps", "out of range"], "train.eps")

    # Missing required keys.
    case("missing [data] train", {"data.train": None}, ["missing", "[data] train"])
    case("missing [train] steps", {"train.steps": None}, ["missing", "[train] steps"])
    case("missing [model] d_model", {"model.d_model": None}, ["missing", "[model] d_model"])

    # Impossible values.
    for key, value in [("model.n_layer", "0"), ("model.seq_len", "-4"), ("model.vocab_size", "0"),
                       ("train.micro_batch", "0"), ("train.grad_accum", "0"),
                       ("train.steps", "-1"), ("parallel.tp", "0"), ("log.every", "0")]:
        case(f"non-positive {key}", {key: value}, [key.split(".")[1], "must be positive"], key)
    for key, value in [("train.lr", "-1e-3"), ("train.grad_clip", "-1"),
                       ("train.weight_decay", "-0.1"), ("train.warmup_steps", "-5"),
                       ("log.peak_tflops", "-1.0")]:
        case(f"negative {key}", {key: value}, [key.split(".")[1], ">= 0"], key)
    case("beta1 = 1", {"train.beta1": "1.0"}, ["beta1", "[0, 1)"], "train.beta1")
    case("beta2 < 0", {"train.beta2": "-0.1"}, ["beta2", "[0, 1)"], "train.beta2")
    case("eps = 0", {"train.eps": "0"}, ["eps", "> 0"], "train.eps")
    case("keep = 0", {"checkpoint.keep": "0"}, ["keep", ">= 1"], "checkpoint.keep")
    case("max_seq_len < seq_len", {"model.max_seq_len": "8"},
         ["[model] seq_len = 16", "[model] max_seq_len = 8", "seq_len must be <= max_seq_len"],
         "model.max_seq_len")
    case("max_seq_len = 0", {"model.max_seq_len": "0"}, ["max_seq_len", "must be positive"],
         "model.max_seq_len")
    text, keys, _ = render(secs, {"model.n_head": "3"})
    expect_error("n_head does not divide d_model", c.write(text), (), ["n_head", "d_model"],
                 ((keys["model.n_head"][0], keys["model.n_head"][2]),
                  (keys["model.d_model"][0], keys["model.d_model"][2])))
    text, keys, _ = render(secs, {"train.min_lr": "0.01"})
    expect_error("min_lr > lr", c.write(text), (), ["min_lr", "[train] lr"],
                 ((keys["train.min_lr"][0], keys["train.min_lr"][2]),
                  (keys["train.lr"][0], keys["train.lr"][2])))
    for key, value, allowed in [
            ("train.lr_schedule", '"linear"', '"cosine", "constant"'),
            ("train.recompute", '"all"', '"none", "gelu", "block"'),
            ("precision.compute", '"fp16"', '"fp32", "bf16"'),
            ("kernels.attention", '"xformers"', '"auto", "flash", "cudnn"'),
            ("parallel.backend", '"gloo"', '"nccl", "mpi", ""')]:
        case(f"unknown {key}", {key: value}, [key.split(".")[1], allowed], key)
    text, keys, _ = render(secs, {"parallel.tp": "2", "parallel.pp": "3"})
    expect_error("degrees vs world size", c.write(text), (),
                 ["dp = 1", "tp = 2", "pp = 3", "cp = 1", "world size 1"],
                 ((keys["parallel.tp"][0], keys["parallel.tp"][2]),
                  (keys["parallel.pp"][0], keys["parallel.pp"][2])))
    case("ep does not divide dp*cp", {"parallel.ep": "2", "model.n_experts": "4"},
         ["ep = 2", "dp*cp"], "parallel.ep")
    # HSDP (parallel/hsdp.cu): dp_replicate >= 1, dividing dp; not with compressed reductions,
    # DiLoCo islands or the noise scale.
    case("dp_replicate does not divide dp", {"parallel.dp": "3", "parallel.dp_replicate": "2"},
         ["dp_replicate = 2", "does not divide", "[parallel] dp = 3", "HSDP"],
         "parallel.dp_replicate")
    case("dp_replicate 0", {"parallel.dp_replicate": "0"},
         ["dp_replicate = 0", "must be at least 1"], "parallel.dp_replicate")
    case("dp_replicate with grad_compression",
         {"parallel.dp": "2", "parallel.dp_replicate": "2", "parallel.grad_compression": '"int8"'},
         ["dp_replicate = 2", 'grad_compression = "int8"', "not supported"],
         "parallel.dp_replicate")
    case("dp_replicate with diloco_islands",
         {"parallel.dp": "2", "parallel.dp_replicate": "2", "parallel.diloco_islands": "1"},
         ["dp_replicate = 2", "diloco_islands = 1", "not supported"], "parallel.dp_replicate")
    # [parallel] tp_overlap (parallel/tensor_parallel_overlap.cu): tp > 1, sp, not with FP8.
    case("tp_overlap with tp = 1", {"parallel.tp_overlap": "true"},
         ["tp_overlap = true", "[parallel] tp = 1", "set tp > 1"], "parallel.tp_overlap")
    case("tp_overlap without sp",
         {"parallel.tp": "2", "parallel.sp": "false", "parallel.tp_overlap": "true"},
         ["tp_overlap = true", "[parallel] sp = false", "set sp = true"], "parallel.tp_overlap")
    case("tp_overlap with fp8",
         {"parallel.tp": "2", "parallel.tp_overlap": "true", "precision.compute": '"fp8"'},
         ["tp_overlap = true", 'compute = "fp8"', "not supported"], "parallel.tp_overlap")
    case("unknown reduce_dtype", {"parallel.reduce_dtype": '"fp16"'},
         ["reduce_dtype", '"fp32", "bf16"'], "parallel.reduce_dtype")
    text, keys, _ = render(secs, {"parallel.dp": "2", "parallel.reduce_dtype": '"bf16"',
                                  "parallel.grad_compression": '"int8"'})
    expect_error("reduce_dtype with grad_compression", c.write(text), (),
                 ['reduce_dtype = "bf16"', 'grad_compression = "int8"', "own codes"],
                 ((keys["parallel.grad_compression"][0], keys["parallel.grad_compression"][2]),
                  (keys["parallel.reduce_dtype"][0], keys["parallel.reduce_dtype"][2])))
    # Gradient buckets and FSDP's prefetch depth (parallel/grad_buckets.cu, parallel/fsdp.cu).
    case("negative bucket_mb", {"parallel.bucket_mb": "-1"}, ["bucket_mb = -1", "must be >= 0"],
         "parallel.bucket_mb")
    case("bucket_mb with grad_compression",
         {"parallel.dp": "2", "parallel.bucket_mb": "25", "parallel.grad_compression": '"int8"'},
         ["bucket_mb = 25", 'grad_compression = "int8"', "error feedback per unit"],
         "parallel.bucket_mb")
    for value in ("0", "-2"):
        case(f"fsdp_prefetch {value}", {"parallel.zero": "3", "parallel.fsdp_prefetch": value},
             [f"fsdp_prefetch = {value}", "must be >= 1"], "parallel.fsdp_prefetch")
    case("fsdp_prefetch without FSDP", {"parallel.fsdp_prefetch": "2"},
         ["fsdp_prefetch = 2", "needs FSDP", "zero = 0"], "parallel.fsdp_prefetch")
    case("train glob matches nothing", {"data.train": f'"{tmp}/nothing_*.bin"'},
         ["[data] train", f"{tmp}/nothing_*.bin", "matches no file"], "data.train")
    case("val glob matches nothing", {"data.val": f'"{tmp}/nothing_*.bin"'},
         ["[data] val", "matches no file"], "data.val")
    case("val_every without val", {"log.val_every": "5"}, ["val_every", "[data] val"],
         "log.val_every")
    case("resume latest without dir", {"checkpoint.resume": '"latest"'}, ["resume", "dir"],
         "checkpoint.resume")
    case("resume path missing", {"checkpoint.resume": f'"{tmp}/no_such_ckpt"'},
         ["resume", "no_such_ckpt"], "checkpoint.resume")
    # cuDNN's attention graph has as many kv heads as query heads: with GQA the choice is refused
    # (besides gpt2's refusal of n_kv_head; the same check holds for llama).
    case("cudnn with grouped-query attention",
         {"model.n_kv_head": "1", "kernels.attention": '"cudnn"'},
         ["attention = \"cudnn\"", "does not run grouped-query attention", "n_kv_head = 1"],
         "kernels.attention")
    # Nor has it a block-causal document mask: cudnn with packed documents is refused, naming both.
    case("cudnn with document_mask",
         {"data.document_mask": "true", "kernels.attention": '"cudnn"'},
         ["[kernels] attention = \"cudnn\"", "no block-causal document mask",
          "[data] document_mask = true"],
         "kernels.attention")
    zero_and_offload_cases(c, secs, tmp, case)


def zero_and_offload_cases(c, secs, tmp, case):
    """[parallel] zero against fsdp, and [train] optimizer_offload's needs."""
    text, keys, _ = render(secs, {"parallel.zero": "1", "parallel.fsdp": "true"})
    expect_error("zero and fsdp disagree", c.write(text), (),
                 ["[parallel] fsdp = true", "[parallel] zero = 1", "disagree"],
                 ((keys["parallel.zero"][0], keys["parallel.zero"][2]),
                  (keys["parallel.fsdp"][0], keys["parallel.fsdp"][2])))
    text, keys, _ = render(secs, {"parallel.zero": "3", "parallel.fsdp": "false"})
    expect_error("zero = 3 and fsdp = false disagree", c.write(text), (),
                 ["[parallel] fsdp = false", "[parallel] zero = 3", "disagree"],
                 ((keys["parallel.zero"][0], keys["parallel.zero"][2]),
                  (keys["parallel.fsdp"][0], keys["parallel.fsdp"][2])))
    for zero, fsdp in [("3", None), ("3", "true"), ("2", None), ("1", "false")]:
        edits = {"parallel.zero": zero}
        if fsdp:
            edits["parallel.fsdp"] = fsdp
        text, _, _ = render(secs, edits)
        expect_good(f"zero = {zero}" + (f" with fsdp = {fsdp}" if fsdp else ""), c.write(text),
                    (), {"parallel.zero": int(zero), "parallel.fsdp": zero == "3"})
    case("zero = 4", {"parallel.zero": "4"}, ["zero = 4", "must be 0 (DDP)"], "parallel.zero")
    text, keys, _ = render(secs, {"train.optimizer_offload": '"cpu"'})
    expect_error("offload without a ZeRO stage", c.write(text), (),
                 ['optimizer_offload = "cpu"', "[parallel] zero = 0 (default)", "ZeRO stage"],
                 ((keys["train.optimizer_offload"][0], keys["train.optimizer_offload"][2]),))
    case("nvme without offload_dir", {"train.optimizer_offload": '"nvme"', "parallel.zero": "1"},
         ['optimizer_offload = "nvme"', "offload_dir"], "train.optimizer_offload")
    case("offload_dir missing", {"train.optimizer_offload": '"nvme"', "parallel.zero": "2",
                                 "train.offload_dir": f'"{tmp}/no_such_dir"'},
         ["[train] offload_dir", "no_such_dir", "no such directory"], "train.offload_dir")
    case("unknown offload", {"train.optimizer_offload": '"disk"'},
         ["optimizer_offload", '"none", "cpu", "nvme"'], "train.optimizer_offload")
    # [parallel] grad_compression (parallel/grad_compression.cu): not with FSDP, topk_ratio in
    # (0, 1], one of the three names.
    text, keys, _ = render(secs, {"parallel.zero": "3", "parallel.grad_compression": '"int8"'})
    expect_error("grad_compression with FSDP", c.write(text), (),
                 ['[parallel] grad_compression = "int8"', "[parallel] zero = 3", "FSDP"],
                 ((keys["parallel.grad_compression"][0], keys["parallel.grad_compression"][2]),
                  (keys["parallel.zero"][0], keys["parallel.zero"][2])))
    case("topk_ratio 0", {"parallel.grad_compression": '"topk"', "parallel.topk_ratio": "0.0"},
         ["topk_ratio = 0", "must be in (0, 1]"], "parallel.topk_ratio")
    case("unknown grad_compression", {"parallel.grad_compression": '"fp16"'},
         ["grad_compression", '"none", "int8", "topk"'], "parallel.grad_compression")
    text, _, _ = render(secs, {"parallel.zero": "2", "parallel.grad_compression": '"topk"',
                               "parallel.topk_ratio": "0.25"})
    expect_good("zero = 2 with topk 0.25", c.write(text), (),
                {"parallel.grad_compression": "topk", "parallel.topk_ratio": 0.25})


def model_file_cases(tmp):
    c = Case(tmp)
    secs = base_sections(tmp)
    no_model = {f"model.{k}": None for k in MODEL_KEYS}
    files = {
        "missing": (os.path.join(tmp, "absent.bin"), None, "cannot open"),
        "bad magic": (os.path.join(tmp, "magic.bin"), dict(magic=20240520), "magic"),
        "bad version": (os.path.join(tmp, "version.bin"), dict(version=4), "version 4"),
        "truncated": (os.path.join(tmp, "cut.bin"), dict(cut=100), "bytes"),
        "short header": (os.path.join(tmp, "short.bin"), dict(cut=12000), "shorter"),
    }
    for name, (path, kwargs, says) in files.items():
        if kwargs is not None:
            write_model(path, **kwargs)
        text, keys, _ = render(secs, no_model | {"init.from": f'"{path}"'})
        expect_error(f"model file {name}", c.write(text), (), ["[init] from", path, says],
                     ((keys["init.from"][0], keys["init.from"][2]),))
    good = os.path.join(tmp, "model.bin")
    write_model(good, L=2, NH=2, C=8, maxT=16, V=100)
    text, keys, _ = render(secs, {"model.n_layer": "3", "init.from": f'"{good}"'})
    expect_error("[model] disagrees with the model file", c.write(text), (),
                 ["n_layer=2", "n_layer=3", good],
                 ((keys["model.n_layer"][0], keys["model.n_layer"][2]),))
    text, keys, _ = render(secs, {"model.seq_len": "32", "init.from": f'"{good}"'})
    expect_error("seq_len longer than the model file's maxT", c.write(text), (),
                 ["[model] seq_len = 32", "[model] max_seq_len = 16", "read from " + good,
                  "seq_len must be <= max_seq_len"],
                 ((keys["model.seq_len"][0], keys["model.seq_len"][2]),))
    text, keys, _ = render(secs, {"model.max_seq_len": "32", "init.from": f'"{good}"'})
    expect_error("max_seq_len disagrees with the model file", c.write(text), (),
                 ["max_seq_len=16", "max_seq_len=32", good],
                 ((keys["model.max_seq_len"][0], keys["model.max_seq_len"][2]),))


def override_error_cases(tmp):
    c = Case(tmp)
    text, _, _ = render(base_sections(tmp))
    path = c.write(text)
    missing = os.path.join(tmp, "no_such_config.toml")
    expect_error("missing config file", missing, (), [missing, "cannot read"])
    for arg, names in [
            ("--train.lr=abc", ["lr", "not a TOML value"]),
            ("--train.steps=1.5", ["steps", "expects an integer"]),
            ('--train.lr="x"', ["lr", "expects a number"]),
            ("--data.shuffle=yes", ["shuffle", "true or false"]),
            ("--train.lrr=1", ["unknown key", "lrr"]),
            ("--trian.lr=1", ["unknown section", "trian"]),
            ("--trainlr=1", ["malformed"]),
            ("--train.lr", ["malformed"]),
            ("train.lr=1", ["malformed"]),
            ("--train.lr=-1", ["lr", ">= 0"]),
            ("--train.min_lr=0.1", ["min_lr", "[train] lr"]),
            ("--parallel.dp=2", ["dp = 2", "world size 1"]),
            ("--precision.compute=fp16", ['"fp32", "bf16", "fp8"']),
            ("--data.train=/nonexistent/*.bin", ["matches no file"]),
            ("--train.micro_batch=0", ["micro_batch", "must be positive"])]:
        expect_error(f"override {arg}", path, [arg], names + [arg])


def shipped_configs(tmp):
    """Every configs/*.toml passes --check-config (data on a long shard, one rank)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    shard = os.path.join(tmp, "long_000.bin")
    configs = sorted(os.path.join(root, "configs", f) for f in os.listdir(os.path.join(root, "configs"))
                     if f.endswith(".toml"))
    need = 0
    for path in configs:
        with open(path, "rb") as f:
            c = tomllib.load(f)
        need = max(need, c["train"]["micro_batch"] * c["model"]["seq_len"] + 1)
    header = [0] * 256
    header[0:3] = [20240520, 1, need]
    with open(shard, "wb") as f:
        f.write(struct.pack("<256i", *header) + struct.pack(f"<{need}H", *(i % 257 for i in range(need))))
    for path in configs:
        overrides = [f"--data.train={shard}", f"--data.val={shard}"]
        overrides += [f"--parallel.{k}=1" for k in ("dp", "tp", "pp", "cp", "ep")]
        rc, out, err = run(path, overrides)
        again = rc
        if rc == 0:
            printed = os.path.join(tmp, "printed.toml")
            with open(printed, "w") as f:
                f.write(out)
            again, out2, _ = run(printed)
            again = again if out2 == out else "differs"
        check(rc == 0 and again == 0, f"shipped {os.path.relpath(path, root)} passes --check-config "
              f"and round-trips (exit {rc}, again {again}{': ' + err.strip().splitlines()[-1] if err.strip() else ''})")


def main():
    start = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(3):
            write_shard(os.path.join(tmp, f"train_{i:03d}.bin"))
        write_shard(os.path.join(tmp, "val_000.bin"))
        open(os.path.join(tmp, 'tok "q" \\ é.bin'), "wb").close()  # an odd name that exists
        good_cases(tmp)
        file_error_cases(tmp)
        model_file_cases(tmp)
        override_error_cases(tmp)
        shipped_configs(tmp)
    took = time.time() - start
    print(f"test_config: {CHECKS[0] - len(FAILURES)}/{CHECKS[0]} checks passed "
          f"({Case.counter[0]} configs, {took:.1f} s, binary: {' '.join(BIN)})")
    sys.exit(1 if ONLY.finish(CHECKS[0]) or FAILURES else 0)


if __name__ == "__main__":
    main()
