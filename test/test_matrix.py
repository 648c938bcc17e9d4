"""test/test_matrix.py - every axis at once, against the one-rank run.

Tiny GPTs (2 heads, C = 32, T = 16; L = 4, or 8 for the interleaved row), 10 steps at lr 1e-3 (Adam
eps 1e-6: test_pipeline.train), global batch 8 sequences, random init (every layout starts from the
same weights): per-step losses and gradient norms, the validation loss and the sampled tokens of
each layout equal the one-rank run with the same micro-batches within 1e-5 (fp32):
  dp2 x pp2 x tp2 with FSDP and SP (np = 8), pp2 x cp2 x tp2 (np = 8),
  dp2 x pp2 x cp2 x tp2 with FSDP (np = 16), dp2 x pp2 x cp2 with cp_comm = "all-to-all" and
  FSDP (np = 8), dp2 x pp4 interleaved (v = 2, np = 8);
the pipeline runs check_tied (the two wte copies bitwise equal after every step).
Mixture of experts (4 experts, top-2, in every second block, moe_z_loss on), against the one-rank
MoE run: dp2 x cp2 x tp2 with ep2 (np = 8), pp2 x cp2 x tp2 (np = 8), dp2 x pp2 x cp2 x tp2 with
FSDP and ep4 (np = 16).
Checkpoints: the np = 16 MoE layout saves at step 5; resumed in another 16-rank layout
(pp2 x cp4 x tp2 with ep2) and on one rank, steps 6-10 equal the uninterrupted run within 1e-5.
"""
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_pipeline import C, NH, T, V, train  # noqa: E402
from trainer import Checks, compare_runs, make_experiment, max_rel, seeded_rng  # noqa: E402

checks = Checks("test_matrix")
STEPS = 10


def row(tmp, ref, what, name, L, m, B, **layout):
    t0 = time.time()
    got = train(tmp, name, L, m, B, steps=STEPS, **layout)
    compare_runs(checks, f"{what} ({time.time() - t0:.0f} s)", got, ref)
    return got


def test_rows(tmp):
    ref = train(tmp, "one_m2", 4, 2, 4, steps=STEPS)
    row(tmp, ref, "dp2 x pp2 x tp2 FSDP sp (np=8)", "dpt", 4, 2, 2, dp=2, pp=2, tp=2, fsdp=True)
    row(tmp, ref, "pp2 x cp2 x tp2 (np=8)", "pct", 4, 2, 4, pp=2, cp=2, tp=2)
    row(tmp, ref, "dp2 x pp2 x cp2 x tp2 FSDP (np=16)", "all", 4, 2, 2, dp=2, pp=2, cp=2, tp=2,
        fsdp=True)
    row(tmp, ref, "dp2 x pp2 x cp2 all-to-all FSDP (np=8)", "dpc_a2a", 4, 2, 2, dp=2, pp=2, cp=2,
        fsdp=True, extra=["--parallel.cp_comm=all-to-all"])
    moe = {"n_experts": 4, "top_k": 2, "moe_every": 2, "d_expert": 24}
    z = ["--train.moe_z_loss=0.01"]
    ref_moe = train(tmp, "moe_one", 4, 2, 4, steps=STEPS, moe=moe, extra=z)
    row(tmp, ref_moe, "MoE dp2 x cp2 x tp2 ep2 (np=8)", "moe_dct", 4, 2, 2, moe=moe, extra=z,
        dp=2, cp=2, tp=2, ep=2)
    row(tmp, ref_moe, "MoE pp2 x cp2 x tp2 (np=8)", "moe_pct", 4, 2, 4, moe=moe, extra=z, pp=2,
        cp=2, tp=2)
    d = os.path.join(tmp, "ck")
    full = row(tmp, ref_moe, "MoE dp2 x pp2 x cp2 x tp2 FSDP ep4 (np=16)", "moe_all", 4, 2, 2,
               moe=moe, extra=z, dp=2, pp=2, cp=2, tp=2, ep=4, fsdp=True,
               ckpt={"dir": d, "every": 5})
    resume = {"dir": d, "resume": os.path.join(d, "step_000005")}
    for what, name, B, layout in [("pp2 x cp4 x tp2 ep2 (np=16)", "r16", 4,
                                   dict(pp=2, cp=4, tp=2, ep=2)),
                                  ("one rank", "r1", 4, {})]:
        got = train(tmp, name, 4, 2, B, steps=STEPS, ckpt=resume, moe=moe, extra=z, **layout)
        r = max_rel([s["loss"] for s in got[0]], [s["loss"] for s in full[0][5:]])
        checks.check(f"MoE np=16 save at step 5 resumed at {what}", len(got[0]) == 5 and r < 1e-5,
                     f"steps 6-10 max rel err {r:.2e} vs the uninterrupted run")
    ref8 = train(tmp, "one8_m4", 8, 4, 2, steps=STEPS)
    row(tmp, ref8, "dp2 x pp4 interleaved v=2 (np=8, L=8)", "il", 8, 4, 1, dp=2, pp=4,
        schedule="interleaved", v=2)


def main():
    rng = seeded_rng("test_matrix")
    with tempfile.TemporaryDirectory() as tmp:
        make_experiment(tmp, rng, L=4, NH=NH, C=C, T=T, V=V, model=False)
        test_rows(tmp)
    checks.report()


if __name__ == "__main__":
    main()
