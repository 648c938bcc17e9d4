#!/usr/bin/env python3
"""[kernels] cuda_graph = "step" on the emulated CUDA trainer (training/cuda_graph.h,
test/emu/graphs.cpp): the step's forward and backward captured once (step 2) and replayed (steps
3..), bitwise equal to the eager run.

The emulated runtime records a capturing stream's work with its arguments as they were at the
call and replays the records, so a step that reads a buffer moved after the capture, or a host
value that changed, computes from the old one, and a host wait or an allocation inside the step
fails the capture. Each layout below (dp 2; TEST_FULL=1 adds one rank, tp 2 with SP and pp 2)
runs 4 steps eagerly and with the graph; every step's loss and gradient norm must be the same
bits, and the graph run's log must say it captured, and dp 2's communication counters (replayed
from the captured step) must print as the eager run's. A layout
whose step waits on the host (MoE here, TEST_FULL=1) must say it runs eagerly and why, and so
must the CPU backend, which has no graphs. TEST_FULL=1 also runs each multi-rank graph under a
random stream schedule (EMU_STREAMS=random:SEED: the replay's streams in a random legal order).

The check can fail (TEST_FULL=1, or by hand once): a copy of ./train_emu whose step input
buffer is reallocated every step after the capture (the graph keeps reading the old one) must
differ from the eager run.

Environment: TRAIN (./train_emu), TRAIN_CPU (./train_cpu), TEST_FULL, SEED.
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from trainer import (Checks, base_sections, make_experiment, read_metrics, run,  # noqa: E402
                     seeded_rng, write_config)
from test_stream_schedules import build_sabotaged  # noqa: E402

TRAIN = os.environ.get("TRAIN", "./train_emu")
TRAIN_CPU = os.environ.get("TRAIN_CPU", "./train_cpu")
FULL = os.environ.get("TEST_FULL") == "1"
STEPS = 4
checks = Checks("test_cuda_graphs")

# (label, [parallel], grad_accum, ranks); `make test` runs dp=2, TEST_FULL=1 all
LAYOUTS = [("dp=2", {"dp": 2}, 1, 2), ("one rank", {}, 2, 0), ("tp=2", {"tp": 2, "sp": True}, 1, 2),
           ("pp=2 1f1b", {"pp": 2}, 2, 2)]
CORE = 1
CAPTURED = "graphs   the step's forward and backward captured once"

# The sabotage: the step's token buffer reallocated every step, after the copy the graph reads.
SABOTAGE = ("training/cuda_graph.cu",
            [("  d.tokens = g.tokens, d.targets = g.targets;\n",
              "  g.tokens = (int*)allocate(g.inputs, n * sizeof(int));\n"
              "  ops::copy_to_device_async(g.tokens, mb.tokens, n * sizeof(int), g.compute);\n"
              "  d.tokens = g.tokens, d.targets = g.targets;\n")])


def sections(tmp, name, parallel, accum, graph, model=None):
    sec = base_sections(tmp, STEPS, lr=1e-3, micro_batch=2, grad_accum=accum, weight_decay=0.1,
                        grad_clip=1.0)
    sec["parallel"] = dict({"backend": "nccl"}, **parallel) if parallel else {}
    sec["kernels"] = {"cuda_graph": "step" if graph else "off"}
    if model:
        del sec["init"]
        sec["model"] = model
    sec["log"]["metrics"] = os.path.join(tmp, name + ".jsonl")
    return sec


def train(tmp, name, parallel, accum, ranks, graph, binary=TRAIN, model=None, streams="sync"):
    """(per-step (loss, grad_norm) as exact floats, stdout)."""
    sec = sections(tmp, name, parallel, accum, graph, model)
    r = run(write_config(tmp, name + ".toml", sec), np_ranks=ranks, binary=binary,
            env={"EMU_ORDER": "forward", "EMU_STREAMS": streams})
    steps, _ = read_metrics(sec["log"]["metrics"])
    return [(s["loss"], s["grad_norm"]) for s in steps], r.stdout


def comm_lines(out):
    """The end-of-run communication counters (parallel/comm.h comm_stats_print)."""
    return [line for line in out.splitlines() if line.startswith("comm ")]


def test_layouts(tmp, seed):
    for label, parallel, accum, ranks in LAYOUTS if FULL else LAYOUTS[:CORE]:
        if not checks.wanted(label):
            continue
        name = "".join(c if c.isalnum() else "_" for c in label)
        eager, eager_out = train(tmp, name + "_eager", parallel, accum, ranks, False)
        graph, out = train(tmp, name + "_graph", parallel, accum, ranks, True)
        checks.check(f"{label}: the graph run says it captured the step", CAPTURED in out,
                     out[-600:])
        checks.check(f"{label}: {STEPS} steps' losses and gradient norms bitwise equal to eager",
                     len(eager) == STEPS and graph == eager, f"eager {eager}\ngraph {graph}")
        if ranks:
            checks.check(f"{label}: the communication counters as the eager run's",
                         comm_lines(out) == comm_lines(eager_out) and comm_lines(out),
                         "\n".join(comm_lines(out)))
        if ranks and FULL:  # the replay's lanes under a random stream schedule
            late, _ = train(tmp, name + "_graph_random", parallel, accum, ranks, True,
                            streams=f"random:{seed}")
            checks.check(f"{label}: the graph run under EMU_STREAMS=random:{seed} as eager",
                         late == eager, f"graph {late}")


def test_eager_layouts(tmp):
    if FULL:
        moe = {"n_layer": 2, "n_head": 2, "d_model": 64, "seq_len": 16, "vocab_size": 101,
               "n_experts": 4, "top_k": 2, "moe_every": 2, "d_expert": 32}
        _, out = train(tmp, "moe_graph", {}, 1, 0, True, model=moe)
        checks.check("MoE: runs eagerly and says why (the token counts come to the host)",
                     "runs eagerly: MoE" in out, out[-600:])
    _, out = train(tmp, "cpu_graph", {}, 1, 0, True, binary=TRAIN_CPU)
    checks.check("the CPU backend: runs eagerly and says it has no graphs",
                 "runs eagerly: the CPU backend has no graphs" in out, out[-600:])


def test_sabotage(tmp):
    if not FULL or not checks.wanted("sabotage"):
        return
    binary = build_sabotaged("graph_input_moved", *SABOTAGE)
    eager, _ = train(tmp, "sab_eager", {}, 2, 0, False)
    graph, _ = train(tmp, "sab_graph", {}, 2, 0, True, binary=binary)
    checks.check("sabotage: the step's token buffer moved after the capture makes the graph run "
                 "differ from eager", graph != eager, f"eager {eager}\ngraph {graph}")


def main():
    rng = seeded_rng("test_cuda_graphs", f"; TRAIN={TRAIN}; sabotage: {FULL}")
    with tempfile.TemporaryDirectory() as tmp:
        make_experiment(tmp, rng, L=2, NH=2, C=64, T=16, V=101, n_tokens=STEPS * 2 * 2 * 16 + 1)
        seed = int(rng.integers(1, 2**31))
        checks.run_each(lambda: test_layouts(tmp, seed), lambda: test_eager_layouts(tmp),
                        lambda: test_sabotage(tmp))
    checks.report()


if __name__ == "__main__":
    main()
