#!/usr/bin/env python3
"""DistMM-Pipe against plain batch-sync on a 2-rank, 2-stage CLIP pipeline, measured and simulated.

Trains tiny-clip with both towers split into 2 pipeline stages over 2 MPI ranks (rank 0: the
first block of each tower; rank 1: the second, the heads and the batch-sync), with 4
contrastive groups of 32 per step of 128, under the two schedules, and runs `braid simulate`
on the same plan and schedule. Reports each schedule's median step time, the simulator's
prediction, their ratio, and the speed-up of DistMM-Pipe measured and predicted.

The simulator prices the step with the cost model of configs/clusters/cpu-host.yaml (nominal
figures for a server core), so its absolute prediction is only as good as those figures; the
speed-up compares the schedules on the same footing.

usage: pipe_bench.py --braid build/tools/braid --mpiexec "mpiexec --oversubscribe" [--steps N] [--quick]
                     [--format table|json]
"""

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile

SOURCE_DIR = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

PLAN = """strategy: megatron
layout: monolithic
devices: 2
schedule: batch-sync
virtual_stages: 1
modules:
  - {name: image_encoder, role: encoder, tp: 1, pp: 2, dp: 1, first_device: 0, devices: 2, first_stage: 0,
     microbatch_size: 8, layers_per_stage: [1, 1]}
  - {name: text_encoder, role: encoder, tp: 1, pp: 2, dp: 1, first_device: 0, devices: 2, first_stage: 0,
     microbatch_size: 8, layers_per_stage: [1, 1]}
"""
SCHEDULES = ["batch-sync", "distmm-pipe"]


def run_file(directory):
    with open(os.path.join(SOURCE_DIR, "configs/runs/tiny-clip.yaml")) as f:
        text = f.read()
    configs = os.path.join(SOURCE_DIR, "configs") + "/"
    text = text.replace("model: ../", "model: " + configs).replace("cluster: ../", "cluster: " + configs)
    text = text.replace("contrastive_batch: 128", "contrastive_batch: 32").replace("microbatch: 16", "microbatch: 8")
    path = os.path.join(directory, "clip-pipe.yaml")
    with open(path, "w") as f:
        f.write(text)
    return path


def measure(args, run, plan, schedule, directory):
    metrics = os.path.join(directory, schedule + ".jsonl")
    cmd = [*shlex.split(args.mpiexec), "-n", "2", args.braid, "train", "--config", run, "--plan", plan, "--schedule",
           schedule, "--steps", str(args.steps), "--threads", "1", "--quiet", "--metrics", metrics]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"pipe_bench: {' '.join(cmd)} failed:\n{r.stdout}{r.stderr}")
    with open(metrics) as f:
        steps = [m for m in (json.loads(line) for line in f if line.strip()) if not m.get("summary")]
    times = [128 / m["samples_per_s"] for m in steps if not m.get("eval") and m["samples_per_s"] > 0]
    warm = times[min(3, len(times) - 1):]  # the first steps pay for first touches
    losses = [m["loss"] for m in steps if not m.get("eval")]
    return statistics.median(warm), losses


def simulate(args, run, plan, schedule):
    r = subprocess.run([args.braid, "simulate", "--config", run, "--plan", plan, "--schedule", schedule, "--format",
                        "json"], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"pipe_bench: braid simulate failed:\n{r.stderr}")
    return json.loads(r.stdout)["step_time_s"]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--braid", required=True)
    p.add_argument("--mpiexec", default="mpiexec")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--quick", action="store_true", help="12 steps")
    p.add_argument("--format", choices=["table", "json"], default="table")
    args = p.parse_args()
    if args.quick:
        args.steps = 12
    with tempfile.TemporaryDirectory() as d:
        run = run_file(d)
        plan = os.path.join(d, "clip-pp2.yaml")
        with open(plan, "w") as f:
            f.write(PLAN)
        rows = {}
        for s in SCHEDULES:
            measured, losses = measure(args, run, plan, s, d)
            rows[s] = {"measured_step_s": measured, "simulated_step_s": simulate(args, run, plan, s), "losses": losses}
    if rows["batch-sync"]["losses"] != rows["distmm-pipe"]["losses"]:
        # Same data, same gradients: the schedules only reorder work (the loss sums per group).
        a, b = rows["batch-sync"]["losses"], rows["distmm-pipe"]["losses"]
        worst = max(abs(x - y) / abs(y) for x, y in zip(a, b))
        if worst > 1e-4:
            sys.exit(f"pipe_bench: the schedules trained differently (relative loss gap {worst:.2e})")
    result = {
        "steps": args.steps,
        "schedules": {s: {k: v for k, v in r.items() if k != "losses"} for s, r in rows.items()},
        "measured_speedup": rows["batch-sync"]["measured_step_s"] / rows["distmm-pipe"]["measured_step_s"],
        "simulated_speedup": rows["batch-sync"]["simulated_step_s"] / rows["distmm-pipe"]["simulated_step_s"],
    }
    for s, r in result["schedules"].items():
        r["measured_over_simulated"] = r["measured_step_s"] / r["simulated_step_s"]
    if args.format == "json":
        print(json.dumps(result, indent=2))
        return
    print(f"tiny-clip, 2 ranks x 2 pipeline stages, 4 contrastive groups of 32 per step, {args.steps} steps")
    print(f"{'schedule':<12} {'measured':>10} {'simulated':>10} {'ratio':>7}")
    for s, r in result["schedules"].items():
        print(f"{s:<12} {r['measured_step_s'] * 1e3:>8.2f}ms {r['simulated_step_s'] * 1e3:>8.2f}ms "
              f"{r['measured_over_simulated']:>7.2f}")
    print(f"DistMM-Pipe speed-up: measured {result['measured_speedup']:.3f}x, "
          f"simulated {result['simulated_speedup']:.3f}x")


if __name__ == "__main__":
    main()
