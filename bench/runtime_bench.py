#!/usr/bin/env python3
"""The runtime against the simulator: measured steps of `braid train` under mpiexec next to the
simulated step of the very program the ranks executed, per schedule.

It runs in rounds (--repeats, default 3). Each round first has `braid calibrate` measure this
machine under the same launch (2 and 4 ranks) and write a cluster file, then runs every schedule
of every case once priced on it (`braid train --cluster`): the host's speed drifts by 10-30%
over minutes, so a step is compared with a calibration taken minutes, not a quarter of an hour,
before it. Of each schedule the run with the median measured/simulated counts. With --nominal
the runs keep their own cluster (configs/clusters/cpu-host.yaml: nominal figures) instead.

Cases (each schedule's step is the mean of the run's steps after the first, on the slowest rank,
from the summary line `braid train` writes to its metrics file; the simulated step is the one
the same run computes for its program, replayed on the images the steps trained; "at the mean"
is the same program with every microbatch at the mean of the trained images, as it was priced;
"compute m/s" is the compute per rank and step, measured over simulated (`braid train`'s compute
lines): how well the instructions are priced, apart from the waits between them; "probe" is the
host's speed at one calibrated GEMM case before and after the run against its calibration
(`braid train`'s host speed probe: 1.00 is the host as calibrated, 1.20 a host 20% slower):

  mllm-2     tiny-mllm-4px, colocated (Optimus): the encoder on both ranks, the llm in 2 stages;
             encoder-first, optimus-coarse, optimus-fine, optimus-online
  mllm-4     the same with the llm also TP 2, on 4 ranks
  pipe-2     tiny-mllm in 2 pipeline stages (megatron): 1f1b, gpipe
  pipe-4     the same with 2 data-parallel replicas, on 4 ranks
  clip-2     tiny-clip with both towers in 2 pipeline stages, 4 contrastive groups per step;
             batch-sync, distmm-pipe, two-phase
  clip-4     the same with 2 data-parallel replicas, on 4 ranks
  dp-clip-2, dp-clip-4
             tiny-clip data parallel (batch-sync)
  dp-mllm-2, dp-mllm-4
             tiny-mllm data parallel (1f1b)
  data       tiny-clip data parallel on 2 ranks, with and without the prefetching workers:
             the time each rank takes its samples per step, measured and simulated

Reports measured/simulated per schedule (goal with the calibrated file: within 15% for every
schedule) and whether the two rank the schedules alike (every pair the simulator sets more than
1% apart is ordered the same way when measured).
For Optimus: the speed-up of optimus-fine and optimus-online over encoder-first, measured and
predicted; goals: the measured gain is at least 80% of the predicted gain, and online is at
least as fast as fine. The schedules only reorder work: their losses must agree (relative
1e-4) or the run fails.

With --bind-crowded, a launch of more ranks than the host has cores (calibration and training
alike) binds each rank to a core, round robin (Open MPI's --bind-to core:overload-allowed), so
the ranks that share a core stay the same instead of migrating between them.

usage: runtime_bench.py --braid build/tools/braid --mpiexec "mpiexec --oversubscribe" [--steps N] [--repeats R]
                        [--quick] [--nominal] [--ranks N] [--bind-crowded] [--format table|json]
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
MLLM = os.path.join(SOURCE_DIR, "configs/runs/tiny-mllm-4px.yaml")
MLLM_PLAIN = os.path.join(SOURCE_DIR, "configs/runs/tiny-mllm.yaml")
CLIP = os.path.join(SOURCE_DIR, "configs/runs/tiny-clip.yaml")
OPTIMUS = ["encoder-first", "optimus-coarse", "optimus-fine", "optimus-online"]
CONTRASTIVE = ["batch-sync", "distmm-pipe", "two-phase"]
PIPELINE = ["1f1b", "gpipe"]
WITHIN = 0.15  # the goal: |measured / simulated - 1| at most this, with the calibrated cluster file


def clip_pp2(dp):
    """Both CLIP towers in 2 pipeline stages, `dp` replicas."""
    return f"""strategy: megatron
layout: monolithic
devices: {2 * dp}
schedule: batch-sync
virtual_stages: 1
modules:
  - {{name: image_encoder, role: encoder, tp: 1, pp: 2, dp: {dp}, first_device: 0, devices: {2 * dp}, first_stage: 0,
     microbatch_size: 8, layers_per_stage: [1, 1]}}
  - {{name: text_encoder, role: encoder, tp: 1, pp: 2, dp: {dp}, first_device: 0, devices: {2 * dp}, first_stage: 0,
     microbatch_size: 8, layers_per_stage: [1, 1]}}
"""


def launch(args, ranks):
    """The mpiexec command line that starts `ranks` processes."""
    crowded = ranks > (os.cpu_count() or 1)
    return [*shlex.split(args.mpiexec), *(["--bind-to", "core:overload-allowed"] if crowded and args.bind_crowded
                                          else []), "-n", str(ranks)]


def calibrate(args, ranks, directory, k):
    """Measures this machine under a launch of `ranks` for round `k`; returns the cluster file's path."""
    path = os.path.join(directory, f"cluster-{ranks}-{k}.yaml")
    cmd = [*launch(args, ranks), args.braid, "calibrate", "--out", path, "--quiet",
           *(["--quick"] if args.quick else [])]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=SOURCE_DIR)
    if r.returncode != 0:
        sys.exit(f"runtime_bench: {' '.join(cmd)} failed:\n{r.stdout}{r.stderr}")
    return path


def clip_groups_run(directory):
    """tiny-clip with 4 contrastive groups of 32 per step, microbatches of 8."""
    with open(CLIP) as f:
        text = f.read()
    configs = os.path.join(SOURCE_DIR, "configs") + "/"
    text = text.replace("model: ../", "model: " + configs).replace("cluster: ../", "cluster: " + configs)
    text = text.replace("contrastive_batch: 128", "contrastive_batch: 32").replace("microbatch: 16", "microbatch: 8")
    path = os.path.join(directory, "clip-groups.yaml")
    with open(path, "w") as f:
        f.write(text)
    return path


def train(args, ranks, config, extra, directory, name):
    """Runs braid train (on the calibrated cluster file of `ranks`, if any); returns (its summary line, its losses)."""
    metrics = os.path.join(directory, name + ".jsonl")
    cluster = ["--cluster", args.clusters[ranks]] if ranks in args.clusters else []
    cmd = [*launch(args, ranks), args.braid, "train", "--config", config, "--steps",
           str(args.steps), "--threads", "1", "--quiet", "--metrics", metrics, *cluster, *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=SOURCE_DIR)
    if r.returncode != 0:
        sys.exit(f"runtime_bench: {' '.join(cmd)} failed:\n{r.stdout}{r.stderr}")
    with open(metrics) as f:
        lines = [json.loads(line) for line in f if line.strip()]
    summary = [m for m in lines if m.get("summary")][-1]
    losses = [m["loss"] for m in lines if "loss" in m]
    return summary, losses


def same_training(rows, case):
    names = list(rows)
    base = rows[names[0]]["losses"]
    for n in names[1:]:
        worst = max(abs(a - b) / abs(b) for a, b in zip(rows[n]["losses"], base))
        if worst > 1e-4:
            sys.exit(f"runtime_bench: {case}: {n} trained differently from {names[0]} (relative loss gap {worst:.2e})")


def ranking_agrees(rows):
    names = list(rows)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            sa, sb = rows[a]["simulated_step_s"], rows[b]["simulated_step_s"]
            if abs(sa - sb) <= 0.01 * max(sa, sb):
                continue  # the simulator calls them even
            ma, mb = rows[a]["measured_step_s"], rows[b]["measured_step_s"]
            if (sa < sb) != (ma < mb):
                return False
    return True


def compute_ratio(summary):
    """Measured over simulated compute per rank and step (forwards, backwards and the rest): how
    well the instructions are priced, apart from the waits between them."""
    simulated = sum(summary["simulated_compute_s"].values())
    return sum(summary["measured_compute_s"].values()) / simulated if simulated > 0 else 0.0


def round_of_runs(args, directory, cases, k, runs):
    """Round `k`: each case's every schedule once, priced on this round's calibration (the host's
    speed drifts by 10-30% over minutes: a step measured next to its calibration compares like
    with like), appended to runs[name][schedule]."""
    for name, ranks, config, base, schedules in cases:
        print(f"runtime_bench: round {k + 1} of {args.repeats}: {name} ...", file=sys.stderr, flush=True)
        for s in schedules:
            runs.setdefault(name, {}).setdefault(s, []).append(
                train(args, ranks, config, [*base, "--schedule", s], directory, f"{name}-{s}-{k}"))


def schedules_case(name, ranks, schedules, runs):
    """A case from its schedules' runs, one a round: of each schedule the run with the median
    measured/simulated."""
    rows = {}
    for s in schedules:
        summary, losses = sorted(runs[s], key=lambda run: run[0]["measured_over_simulated"])[len(runs[s]) // 2]
        rows[s] = {"measured_step_s": summary["measured_step_s"], "simulated_step_s": summary["simulated_step_s"],
                   "priced_step_s": summary["priced_step_s"],
                   "measured_over_simulated": summary["measured_over_simulated"],
                   "compute_measured_over_simulated": compute_ratio(summary),
                   # The host's GEMM speed around the run against its calibration (1: as calibrated).
                   "probe": [summary.get("probe_before", 0), summary.get("probe_after", 0)],
                   "measured_idle_s": summary["measured_idle_s"], "losses": losses}
    if len(rows) > 1:
        same_training(rows, name)
    out = {"ranks": ranks, "schedules": {s: {k: v for k, v in r.items() if k != "losses"} for s, r in rows.items()},
           "ranking_agrees": ranking_agrees(rows),
           "within_15_percent": all(abs(r["measured_over_simulated"] - 1) <= WITHIN for r in rows.values())}
    if schedules == OPTIMUS:
        first = rows["encoder-first"]
        out["speedup"] = {}
        for s in ["optimus-fine", "optimus-online"]:
            measured = first["measured_step_s"] / rows[s]["measured_step_s"]
            predicted = first["simulated_step_s"] / rows[s]["simulated_step_s"]
            # No predicted gain, no share of it: null in the JSON (NaN is no JSON).
            share = (measured - 1) / (predicted - 1) if predicted > 1 else None
            out["speedup"][s] = {"measured": measured, "predicted": predicted, "share_of_predicted_gain": share}
        out["goals"] = {
            "gain_at_least_80_percent": all(v["share_of_predicted_gain"] is not None and
                                            v["share_of_predicted_gain"] >= 0.8 for v in out["speedup"].values()),
            "online_at_least_fine": rows["optimus-online"]["measured_step_s"] <= rows["optimus-fine"]["measured_step_s"],
        }
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--braid", required=True)
    p.add_argument("--mpiexec", default="mpiexec")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--repeats", type=int, default=3,
                   help="rounds: a calibration, then one run of each schedule; the run with the median ratio counts")
    p.add_argument("--quick", action="store_true", help="4 steps of the 2-rank cases, once: checks they run and agree")
    p.add_argument("--nominal", action="store_true",
                   help="price the runs on their own cluster file (nominal figures) instead of calibrating")
    p.add_argument("--ranks", type=int, choices=[2, 4], help="only the cases on this many ranks")
    p.add_argument("--bind-crowded", action="store_true",
                   help="bind each rank to a core, round robin, where there are more ranks than cores (Open MPI)")
    p.add_argument("--format", choices=["table", "json"], default="table")
    args = p.parse_args()
    check_tools(p, args.braid, args.mpiexec, [("--steps", args.steps), ("--repeats", args.repeats)])
    if args.quick:
        args.steps, args.repeats = 4, 1
    result = {"steps": args.steps, "repeats": args.repeats, "cores": os.cpu_count(),
              "cluster": "run's own (nominal)" if args.nominal else "calibrated",
              "bind_crowded": args.bind_crowded, "cases": {}}
    with tempfile.TemporaryDirectory() as d:
        plans = {}
        for dp in [1, 2]:
            plans[dp] = os.path.join(d, f"clip-pp2-dp{dp}.yaml")
            with open(plans[dp], "w") as f:
                f.write(clip_pp2(dp))
        clip_groups = clip_groups_run(d)
        cases = []
        for ranks in [2] if args.quick else [args.ranks] if args.ranks else [2, 4]:
            optimus = ["--strategy", "optimus", "--pp", "2"] + (["--tp", "2"] if ranks == 4 else [])
            pipe = ["--strategy", "megatron", "--pp", "2", "--dp", str(ranks // 2)]
            cases += [(f"mllm-{ranks}", ranks, MLLM, optimus, OPTIMUS),
                      (f"pipe-{ranks}", ranks, MLLM_PLAIN, pipe, PIPELINE),
                      (f"clip-{ranks}", ranks, clip_groups, ["--plan", plans[ranks // 2]], CONTRASTIVE),
                      (f"dp-clip-{ranks}", ranks, CLIP, [], ["batch-sync"]),
                      (f"dp-mllm-{ranks}", ranks, MLLM_PLAIN, [], ["1f1b"])]
        runs = {}
        for k in range(args.repeats):
            args.clusters = {}
            if not args.nominal:
                for ranks in sorted({c[1] for c in cases}):
                    print(f"runtime_bench: round {k + 1} of {args.repeats}: braid calibrate on {ranks} ranks ...",
                          file=sys.stderr, flush=True)
                    args.clusters[ranks] = calibrate(args, ranks, d, k)
            round_of_runs(args, d, cases, k, runs)
        for name, ranks, _, _, schedules in cases:
            result["cases"][name] = schedules_case(name, ranks, schedules, runs[name])
        data = {}  # on the last round's calibration
        for workers in [0, 1] if any(c[1] == 2 for c in cases) else []:
            summary, _ = train(args, 2, CLIP, ["--data-workers", str(workers)], d, f"data-{workers}")
            data[workers] = {k: summary[k] for k in ("measured_data_s", "simulated_data_s", "measured_step_s",
                                                     "simulated_step_s")}
        result["data"] = data

    if args.format == "json":
        print(json.dumps(result, indent=2))
        return
    calibrated = "its round's calibrated" if result["cluster"] == "calibrated" else "the run's own (nominal)"
    print(f"measured (mean of steps 2-{args.steps} on the slowest rank) against simulated, the same program, on "
          f"{calibrated} cluster file: of {args.repeats} rounds the run with the median ratio; {result['cores']} cores")
    for name, case in result["cases"].items():
        crowded = case["ranks"] > (result["cores"] or 1)
        bound = ", each bound to a core" if result["bind_crowded"] else ""
        print(f"\n{name}: {case['ranks']} ranks" + (f" (more ranks than cores: they take turns{bound}, as they did "
                                                      "while calibrating)" if crowded else ""))
        print(f"  {'schedule':<16} {'measured':>10} {'simulated':>10} {'measured/sim':>13} {'at the mean':>12} "
              f"{'compute m/s':>12} {'probe':>10}")
        for s, r in case["schedules"].items():
            probe = "/".join(f"{p:.2f}" for p in r["probe"]) if all(r["probe"]) else "-"
            print(f"  {s:<16} {r['measured_step_s'] * 1e3:>8.2f}ms {r['simulated_step_s'] * 1e3:>8.2f}ms "
                  f"{r['measured_over_simulated']:>13.2f} {r['priced_step_s'] * 1e3:>10.2f}ms "
                  f"{r['compute_measured_over_simulated']:>12.2f} {probe:>10}")
        if len(case["schedules"]) > 1:
            print(f"  ranking of the schedules agrees: {'yes' if case['ranking_agrees'] else 'no'}")
        print(f"  every schedule within {WITHIN:.0%}: {'yes' if case['within_15_percent'] else 'no'}")
        for s, v in case.get("speedup", {}).items():
            share = v["share_of_predicted_gain"]
            print(f"  {s} over encoder-first: measured {v['measured']:.3f}x, predicted {v['predicted']:.3f}x "
                  f"({'no predicted gain' if share is None else f'{share * 100:.0f}% of the predicted gain'})")
        for goal, met in case.get("goals", {}).items():
            print(f"  goal {goal.replace('_', ' ')}: {'met' if met else 'not met'}")
    if result["data"]:
        print("\ntaking the step's samples per rank and step, tiny-clip on 2 ranks (2 ranks x 1 thread hold every "
              "core of a 2-core host: the samples are made in the step's time, with or without a worker)")
        print(f"  {'workers':<8} {'measured':>10} {'simulated':>10} {'step measured':>14} {'step simulated':>15}")
    for workers, v in result["data"].items():
        print(f"  {workers:<8} {v['measured_data_s'] * 1e6:>8.1f}us {v['simulated_data_s'] * 1e6:>8.1f}us "
              f"{v['measured_step_s'] * 1e3:>12.2f}ms {v['simulated_step_s'] * 1e3:>13.2f}ms")


if __name__ == "__main__":
    main()
