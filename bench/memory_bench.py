#!/usr/bin/env python3
"""Per-rank peak memory of `braid train` against the cost model's prediction for the same plan
and rank (plan::device_memory), by kind, for tiny-mllm and tiny-clip at TP 1 and 2, each under
ZeRO 0, 1, 2 and 3.

Layouts (megatron's plan as `braid train --tp T` makes it: every module on every rank, split
over T tensor-parallel ranks, data parallel over the rest):

  mllm-tp1-zN   tiny-mllm on 2 ranks: DP 2
  mllm-tp2-zN   tiny-mllm on 4 ranks: TP 2 x DP 2 (vision, projector and llm all split)
  clip-tp1-zN   tiny-clip on 2 ranks: DP 2
  clip-tp2-zN   tiny-clip on 4 ranks: TP 2 x DP 2 (both towers split over the same TP 2)

Each layout trains --steps steps (default 3: AdamW's moments exist after the first) of the run
file with training.zero_stage N and precision fp32 (what the trainer runs), without prefetching
data workers (their allocations would count as activations), and reads the {"memory": true}
line of its metrics file: every rank's peak by kind, measured at instruction boundaries and
where braid's DP collectives hold their buffers (under ZeRO 2-3 inside forwards and backwards,
where ZeRO holds the most; as the step's last reductions and gathers copy), next to the
prediction for its device, by the cost model braid train prices its step on (braid's kernels,
the samples it trains). The run files draw image sides from 16 to 32 px; --nominal-sizes drops
the distributions so that every sample has the size the planner prices (32 px). Per layout and
kind it reports the largest measured peak over the ranks, the largest predicted, and measured /
predicted; the goal is within 10% for weights, gradients and optimizer state (model state),
activations and communication. "communication" is the host buffers braid's DP collectives copy
through (under ZeRO a unit's copy and shard, one unit at a time; without ZeRO none, as the
all-reduce sums the laid-out gradients in place); the MPI library's own buffers are not in it, and point-to-point sends in flight
are the measured-only kind "messages" (none in these single-stage layouts, not shown). The
prediction leaves out the cluster's reserved memory (0.25 GiB on cpu-host), as the measurement
leaves out the heap before the first step.

Ranking: within each model, the layouts ordered by their peak device's predicted total (without
the reserved memory, the same on every device and layout) and by the measured peak total; every
pair the prediction sets more than 1% apart must be ordered the same way when measured.

--quick (what ctest runs) trains 2 steps of the 2-rank layouts and fails unless the weights, the
gradients, the optimizer state and the communication buffers agree with the prediction within 1%
on every rank (they agree to the byte at every ZeRO stage but for tiny-clip's logit scale, one
parameter the planner places nowhere); it asserts no time.

usage: memory_bench.py --braid build/tools/braid --mpiexec "mpiexec --oversubscribe" [--steps N]
                       [--nominal-sizes] [--quick] [--format table|json]
"""

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile

from bench_tools import check_tools

SOURCE_DIR = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
MLLM = os.path.join(SOURCE_DIR, "configs/runs/tiny-mllm.yaml")
CLIP = os.path.join(SOURCE_DIR, "configs/runs/tiny-clip.yaml")
KINDS = ["weights", "gradients", "optimizer", "activations", "communication"]
GOAL_KINDS = KINDS
STATE_KINDS = ["weights", "gradients", "optimizer", "communication"]  # --quick: within STATE_TOLERANCE on every rank
STATE_TOLERANCE = 0.01
GOAL = 0.10
MiB = 2.0**20


def layouts(quick):
    """(name, model, run file, ranks, tp, zero stage) of every layout measured."""
    groups = [("mllm-tp1", "tiny-mllm", MLLM, 2, 1), ("mllm-tp2", "tiny-mllm", MLLM, 4, 2),
              ("clip-tp1", "tiny-clip", CLIP, 2, 1), ("clip-tp2", "tiny-clip", CLIP, 4, 2)]
    return [(f"{name}-z{zero}", model, base, ranks, tp, zero) for name, model, base, ranks, tp in groups
            if not (quick and ranks > 2) for zero in range(4)]


def run_file(directory, base, zero, nominal):
    """A copy of `base` with training.zero_stage and fp32 set and its paths made absolute; with
    `nominal`, without its size distributions."""
    with open(base) as f:
        lines = f.read().splitlines()
    configs = os.path.join(SOURCE_DIR, "configs") + "/"
    out = []
    for line in lines:
        key = line.strip().split(":", 1)[0]
        if line.startswith("  ") and key in ("zero_stage", "precision"):
            continue
        if nominal and key == "distribution":
            continue
        out.append(line.replace("model: ../", "model: " + configs).replace("cluster: ../", "cluster: " + configs))
        if line == "training:":
            out += [f"  zero_stage: {zero}", "  precision: fp32"]
    path = os.path.join(directory, f"{os.path.basename(base)[:-5]}-zero{zero}.yaml")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")
    return path


def train(args, directory, name, config, ranks, tp):
    """Runs braid train; returns its memory line."""
    metrics = os.path.join(directory, name + ".jsonl")
    cmd = [*shlex.split(args.mpiexec), "-n", str(ranks), args.braid, "train", "--config", config, "--steps",
           str(args.steps), "--threads", "1", "--data-workers", "0", "--quiet", "--metrics", metrics, "--tp", str(tp)]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=SOURCE_DIR)
    if r.returncode != 0:
        sys.exit(f"memory_bench: {' '.join(cmd)} failed:\n{r.stdout}{r.stderr}")
    with open(metrics) as f:
        lines = [json.loads(line) for line in f if line.strip()]
    memory = [m for m in lines if m.get("memory")]
    if len(memory) != 1 or memory[0].get("prediction_error"):
        sys.exit(f"memory_bench: {name}: no memory line with a prediction in {metrics}:\n{r.stdout}")
    return memory[0]


def summarize(line):
    """Per kind: the largest measured and predicted bytes over the ranks; and the peak totals."""
    ranks = line["ranks"]
    row = {"ranks": len(ranks), "kinds": {}}
    for kind in KINDS:
        measured = max(r["measured_bytes"][kind] for r in ranks)
        predicted = max(r["predicted_bytes"][kind] for r in ranks)
        row["kinds"][kind] = {"measured_bytes": measured, "predicted_bytes": predicted,
                              "ratio": measured / predicted if predicted > 0 else None}
    # Model state, rank by rank: the largest |measured / predicted - 1| (--quick's check).
    row["state_worst_rank_deviation"] = {
        k: max(abs(r["measured_bytes"][k] / r["predicted_bytes"][k] - 1) if r["predicted_bytes"][k] > 0
               else float(r["measured_bytes"][k] > 0) for r in ranks) for k in STATE_KINDS}
    row["measured_peak_bytes"] = max(r["measured_bytes"]["total"] for r in ranks)
    # Both without the reserved memory (the measurement's baseline leaves it out).
    row["predicted_peak_bytes"] = max(r["predicted_bytes"]["total"] for r in ranks)
    row["off_goal"] = [k for k in GOAL_KINDS if not within_goal(row["kinds"][k])]
    row["within_goal"] = not row["off_goal"]
    return row


def within_goal(kind):
    """Measured within GOAL of predicted; none measured where none is predicted."""
    if kind["predicted_bytes"] <= 0:
        return kind["measured_bytes"] <= 0
    return abs(kind["ratio"] - 1) <= GOAL


def ranking(rows):
    """The layouts by predicted and by measured peak, and the pairs ordered differently."""
    names = list(rows)
    predicted = sorted(names, key=lambda n: rows[n]["predicted_peak_bytes"])
    measured = sorted(names, key=lambda n: rows[n]["measured_peak_bytes"])
    swapped = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            pa, pb = rows[a]["predicted_peak_bytes"], rows[b]["predicted_peak_bytes"]
            if abs(pa - pb) <= 0.01 * max(pa, pb):
                continue  # the prediction calls them even
            if (pa < pb) != (rows[a]["measured_peak_bytes"] < rows[b]["measured_peak_bytes"]):
                swapped.append([a, b])
    return {"predicted_order": predicted, "measured_order": measured, "swapped_pairs": swapped,
            "agrees": not swapped}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--braid", required=True)
    p.add_argument("--mpiexec", default="mpiexec")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--nominal-sizes", action="store_true",
                   help="every sample at the run's nominal image side and caption length (no distributions)")
    p.add_argument("--quick", action="store_true", help="2 steps, the 2-rank layouts only")
    p.add_argument("--format", choices=["table", "json"], default="table")
    args = p.parse_args()
    check_tools(p, args.braid, args.mpiexec, [("--steps", args.steps)])
    if args.quick:
        args.steps = 2
    result = {"steps": args.steps, "nominal_sizes": args.nominal_sizes, "goal_ratio_within": GOAL, "layouts": {},
              "ranking": {}}
    with tempfile.TemporaryDirectory() as d:
        for name, model, base, ranks, tp, zero in layouts(args.quick):
            print(f"memory_bench: {name} ...", file=sys.stderr, flush=True)
            row = summarize(train(args, d, name, run_file(d, base, zero, args.nominal_sizes), ranks, tp))
            row.update({"model": model, "tp": tp, "dp": ranks // tp, "zero_stage": zero})
            result["layouts"][name] = row
    for model in dict.fromkeys(r["model"] for r in result["layouts"].values()):
        result["ranking"][model] = ranking({n: r for n, r in result["layouts"].items() if r["model"] == model})
    result["all_within_goal"] = all(r["within_goal"] for r in result["layouts"].values())
    result["rankings_agree"] = all(r["agrees"] for r in result["ranking"].values())
    state_off = [f"{n} {k} off by {d:.2%}" for n, r in result["layouts"].items()
                 for k, d in r["state_worst_rank_deviation"].items() if d > STATE_TOLERANCE]

    if args.format == "json":
        print(json.dumps(result, indent=2))
        if args.quick and state_off:
            sys.exit("memory_bench: weights, gradients, optimizer state or communication off the prediction by more than "
                     f"{STATE_TOLERANCE:.0%} on some rank: " + ", ".join(state_off))
        return
    sizes = "every sample at the nominal size" if args.nominal_sizes else "the run files' size distributions"
    print(f"peak memory per rank (largest over the ranks), measured by braid train ({args.steps} steps, fp32, "
          f"{sizes}) against the cost model's prediction for the same plan; MiB")
    header = f"{'layout':<14} {'ranks':>5} " + " ".join(f"{k:>22}" for k in KINDS) + f" {'peak (no reserved)':>20}"
    print(header)
    print(f"{'':<14} {'':>5} " + " ".join(f"{'meas / pred  ratio':>22}" for _ in KINDS) + f" {'meas / pred':>20}")
    for name, r in result["layouts"].items():
        cells = []
        for k in KINDS:
            c = r["kinds"][k]
            ratio = f"{c['ratio']:.2f}" if c["ratio"] is not None else "-"
            cells.append(f"{c['measured_bytes'] / MiB:>8.3f}/{c['predicted_bytes'] / MiB:>8.3f} {ratio:>4}")
        peak = f"{r['measured_peak_bytes'] / MiB:.3f}/{r['predicted_peak_bytes'] / MiB:.3f}"
        print(f"{name:<14} {r['ranks']:>5} " + " ".join(f"{c:>22}" for c in cells) + f" {peak:>20}")
    print(f"\nwithin {GOAL * 100:.0f}% for {', '.join(GOAL_KINDS)} in every layout: "
          f"{'yes' if result['all_within_goal'] else 'no'}")
    for name, r in result["layouts"].items():
        off = [f"{k} {r['kinds'][k]['ratio']:.2f}" if r["kinds"][k]["ratio"] is not None
               else f"{k} {r['kinds'][k]['measured_bytes'] / MiB:.3f} MiB, none predicted" for k in r["off_goal"]]
        if off:
            print(f"  {name}: {', '.join(off)}")
    for model, rk in result["ranking"].items():
        print(f"\n{model}: layouts by predicted peak: {' < '.join(rk['predicted_order'])}")
        print(f"{model}: layouts by measured peak:  {' < '.join(rk['measured_order'])}")
        verdict = "yes" if rk["agrees"] else "no, " + "; ".join(" vs ".join(p) for p in rk["swapped_pairs"])
        print(f"{model}: the prediction ranks the layouts as measured (pairs more than 1% apart): {verdict}")
    if args.quick and state_off:
        sys.exit("memory_bench: weights, gradients, optimizer state or communication off the prediction by more than "
                 f"{STATE_TOLERANCE:.0%} on some rank: " + ", ".join(state_off))


if __name__ == "__main__":
    main()
