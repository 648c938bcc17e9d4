"""bench/e2e.py - end-to-end training throughput of ./train (bench/run_all.sh e2e; docs/PERF.md).

    python3 bench/e2e.py [--train ./train] [--models 124m,1558m] [--recompute none,gelu,block]
                         [--steps 15] [--skip 5] [--out DIR] [--set section.key=value ...]

For each model (configs/gpt2_124m.toml, configs/gpt2_1558m.toml, in bf16) and recompute mode,
finds the largest micro-batch that fits on the GPU by trying descending powers of two (a run that
stops with an out-of-memory error moves on to the next size; any other failure ends that mode's
search and is reported), then reports from that run's JSONL metrics: tokens/s and ms per step
(median over the steps after the first --skip), MFU and HFU (training/metrics.h: 6N + 6LCT FLOPs per
token against the device's dense BF16 peak; HFU adds the recomputed forward), and the peak of the
memory allocated through ops::alloc (cuBLAS/NCCL internals not included). Targets (the issue):
MFU >= 50% for 124M, >= 55% for 1.5B; a miss says by how many points.

Data: a synthetic llm.c shard of uniform random tokens (bench/make_tokens.py). Standard library
only; each run's log is kept in --out.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = {
    "124m": dict(name="GPT-2 124M", config="configs/gpt2_124m.toml",
                 batches=[128, 64, 32, 16, 8, 4, 2, 1], target_mfu=50.0),
    "1558m": dict(name="GPT-2 1.5B", config="configs/gpt2_1558m.toml",
                  batches=[64, 32, 16, 8, 4, 2, 1], target_mfu=55.0),
}
OOM_MARKERS = ("out of gpu memory", "out of memory")


def overrides(a, shard, metrics, batch, recompute):
    """Everything that turns the training config into a short benchmark run."""
    return [f"--train.micro_batch={batch}", "--train.grad_accum=1", f"--train.steps={a.steps}",
            f"--train.recompute={recompute}", "--precision.compute=bf16",
            f"--data.train={shard}", "--data.val=", "--log.val_every=0",
            "--log.sample_every=0", "--log.every=1", "--checkpoint.dir=",
            f"--log.metrics={metrics}"] + [f"--{s}" for s in a.set]


def read_jsonl(path):
    run, steps = None, []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                rec = json.loads(line)
                if "run" in rec:
                    run = rec["run"]
                elif "loss" in rec:
                    steps.append(rec)
    return run, steps


def try_batch(a, model, recompute, batch, shard):
    """One run. Returns ("ok", result), ("oom", None) or ("error", message)."""
    tag = f"{model}_{recompute}_B{batch}"
    metrics = os.path.join(a.out, f"e2e_{tag}.jsonl")
    log = os.path.join(a.out, f"e2e_{tag}.log")
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = [a.train, MODELS[model]["config"]] + overrides(a, shard, metrics, batch, recompute)
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
        output, rc = r.stdout + r.stderr, r.returncode
    except subprocess.TimeoutExpired as e:
        output, rc = f"{e.stdout or ''}{e.stderr or ''}\ntimed out after {a.timeout} s", -1
    with open(log, "w") as f:
        f.write(" ".join(cmd) + "\n" + (output if isinstance(output, str) else str(output)))
    if rc != 0:
        if any(m in output.lower() for m in OOM_MARKERS):
            return "oom", None
        lines = [ln.strip() for ln in output.split("\n") if ln.strip()] or ["(no output)"]
        first_error = next((ln for ln in lines if ln.lower().startswith("error")), lines[-1])
        return "error", f"exit {rc}: {first_error[:200]} (log {log})"
    run, steps = read_jsonl(metrics)
    timed = steps[a.skip:]
    if not timed:
        return "error", f"no step records after the first {a.skip} in {metrics}"

    def median(key):
        vals = [s[key] for s in timed if s.get(key) is not None]
        return statistics.median(vals) if vals else None

    return "ok", dict(batch=batch, tokens_per_s=median("tokens_per_s"), ms=median("ms"),
                      mfu=median("mfu"), hfu=median("hfu"),
                      peak_bytes=max(s["mem_peak_bytes"] for s in steps),
                      parameters=(run or {}).get("parameters"), steps=len(steps))


def search(a, model, recompute, shard):
    """Largest power-of-two micro-batch that runs; returns (result or None, note)."""
    for batch in a.batches or MODELS[model]["batches"]:
        status, value = try_batch(a, model, recompute, batch, shard)
        print(f"  {MODELS[model]['name']} recompute={recompute} B={batch}: "
              f"{status if status != 'ok' else 'fits, %.0f tok/s' % value['tokens_per_s']}"
              f"{': ' + value if status == 'error' else ''}", flush=True)
        if status == "ok":
            return value, ""
        if status == "error":
            return None, value
    return None, "out of memory even at the smallest micro-batch"


def verdict(mfu, target):
    if mfu is None:
        return "n/a: no MFU (device peak unknown; set [log] peak_tflops)"
    pct = 100 * mfu
    return "ok" if pct >= target else f"MISS by {target - pct:.1f} pts"


def print_table(rows, out):
    head = (f"{'model':<11} {'recompute':<9} {'B':>4} {'tokens/s':>10} {'ms/step':>9} "
            f"{'MFU':>6} {'HFU':>6} {'peak mem':>10}  {'target':<9} verdict")
    print(head, file=out)
    for r in rows:
        res = r["result"]
        if res is None:
            print(f"{r['name']:<11} {r['recompute']:<9} {'-':>4} {'-':>10} {'-':>9} {'-':>6} "
                  f"{'-':>6} {'-':>10}  {r['target']:<9} FAILED: {r['note']}", file=out)
            continue
        pct = (lambda x: "-" if x is None else f"{100 * x:.1f}%")
        print(f"{r['name']:<11} {r['recompute']:<9} {res['batch']:>4} "
              f"{res['tokens_per_s']:>10.0f} {res['ms']:>9.1f} {pct(res['mfu']):>6} "
              f"{pct(res['hfu']):>6} {res['peak_bytes'] / 2**30:>6.1f} GiB  {r['target']:<9} "
              f"{verdict(res['mfu'], r['target_mfu'])}", file=out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--train", default=os.environ.get("TRAIN", "./train"))
    ap.add_argument("--models", default="124m,1558m")
    ap.add_argument("--recompute", default="none,gelu,block")
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--skip", type=int, default=5, help="first steps left out of the medians")
    ap.add_argument("--batches", default="", help="micro-batches to try, e.g. 16,8 (default: "
                    "descending powers of two per model)")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per run")
    ap.add_argument("--out", default=os.path.join("build", "bench"))
    ap.add_argument("--set", action="append", default=[],
                    help="extra override section.key=value for every run (e.g. model.n_layer=2)")
    a = ap.parse_args()
    a.batches = [int(x) for x in a.batches.split(",") if x]
    os.makedirs(a.out, exist_ok=True)
    shard = os.path.join(a.out, "synthetic_train_000.bin")
    if not os.path.exists(shard):
        subprocess.run([sys.executable, os.path.join(HERE, "make_tokens.py"), shard], check=True)

    rows = []
    for model in a.models.split(","):
        if model not in MODELS:
            sys.exit(f"e2e: unknown model '{model}' (known: {', '.join(MODELS)})")
        m = MODELS[model]
        for recompute in a.recompute.split(","):
            result, note = search(a, model, recompute, shard)
            rows.append(dict(name=m["name"], recompute=recompute, result=result, note=note,
                             target=f"MFU>={m['target_mfu']:.0f}%", target_mfu=m["target_mfu"]))
    print("\n==== end-to-end training (bf16, T=1024, grad_accum 1, one GPU) ====")
    print_table(rows, sys.stdout)
    print("note: MFU = tokens/s x (6N + 6LCT) / dense BF16 peak (H100 SXM and H200: 989.4 "
          "TFLOP/s); HFU adds the recomputed forward. B = the largest power-of-two micro-batch "
          "that fit. For scale, llm.c's published GPT-2 runs and their MFU: "
          "https://github.com/karpathy/llm.c/discussions")
    with open(os.path.join(a.out, "e2e.json"), "w") as f:
        json.dump(rows, f, indent=1)
    with open(os.path.join(a.out, "e2e_table.txt"), "w") as f:
        print_table(rows, f)
    return 0 if all(r["result"] is not None for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
