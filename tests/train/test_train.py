"""braid train as users run it: one process and real MPI processes under mpiexec.

- every layout reproduces the single-process losses and gradients for 3 steps (rel. error
  <= 1e-4): CLIP data parallel on 2 and 4 ranks, DistMM (towers on disjoint ranks) on 2 and
  3 ranks, DistMM-Pipe interleaving, the MLLM data parallel on 2 ranks;
- resuming gives bit-identical losses, and a corrupted checkpoint is reported and skipped;
- a TP 2 x DP 2 checkpoint resumes under DP 4 and under TP 1 x PP 2 on 2 ranks (resharded on
  load) with the uninterrupted run's losses (rel. error <= 1e-6);
- a killed rank ends the run within 30 s, naming the rank, and the last checkpoint resumes;
- learning: tiny-clip's default run reaches >= 90% held-out retrieval, tiny-mllm's caption
  loss falls by half (BRAID_TRAIN_LEARNING=0 skips these two);
- memory: every rank's measured peak by kind next to the cost model's prediction for its
  device; fp32 weights without ZeRO measured = predicted to the byte.

Environment: BRAID_CLI (the braid binary), BRAID_MPIEXEC (mpiexec with its flags, ';'-separated),
BRAID_SOURCE_DIR (the repository).
"""

import json
import math
import os
import pty
import re
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import unittest

SOURCE_DIR = os.path.abspath(
    os.environ.get("BRAID_SOURCE_DIR") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
)
CLI = os.environ.get("BRAID_CLI", "")
MPIEXEC = [a for a in os.environ.get("BRAID_MPIEXEC", "").split(";") if a]
CLIP = os.path.join(SOURCE_DIR, "configs/runs/tiny-clip.yaml")
MLLM = os.path.join(SOURCE_DIR, "configs/runs/tiny-mllm.yaml")
TOLERANCE = 1e-4
# A DistMM plan the planner would not pick on 3 ranks: the image tower on rank 0, the text
# tower data parallel on ranks 1-2.
DISTMM_1_2 = """strategy: distmm
layout: branches
devices: 3
schedule: batch-sync
virtual_stages: 1
modules:
  - {name: image_encoder, role: encoder, tp: 1, pp: 1, dp: 1, first_device: 0, devices: 1, first_stage: 0,
     microbatch_size: 16, layers_per_stage: [2]}
  - {name: text_encoder, role: encoder, tp: 1, pp: 1, dp: 2, first_device: 1, devices: 2, first_stage: 0,
     microbatch_size: 16, layers_per_stage: [2]}
"""
# Both towers in 2 pipeline stages over 2 ranks (rank 1 holds the second blocks, the heads
# and the batch-sync).
# DistTrain: the encoder (and projector) on ranks 0-1, 2 replicas feeding one llm replica
# of 2 stages on ranks 2-3.
DISTTRAIN_FAN_IN = """strategy: disttrain
layout: chain
devices: 4
schedule: 1f1b
virtual_stages: 1
modules:
  - {name: vision, role: encoder, tp: 1, pp: 1, dp: 2, first_device: 0, devices: 2, first_stage: 0,
     microbatch_size: 2, layers_per_stage: [2]}
  - {name: llm, role: llm, tp: 1, pp: 2, dp: 1, first_device: 2, devices: 2, first_stage: 0,
     microbatch_size: 4, layers_per_stage: [1, 1]}
  - {name: projector, role: projector, tp: 1, pp: 1, dp: 2, first_device: 0, devices: 2, first_stage: 0,
     microbatch_size: 2, layers_per_stage: [2]}
"""
CLIP_PP2 = """strategy: megatron
layout: monolithic
devices: 2
schedule: batch-sync
virtual_stages: 1
modules:
  - {name: image_encoder, role: encoder, tp: 1, pp: 2, dp: 1, first_device: 0, devices: 2, first_stage: 0,
     microbatch_size: 16, layers_per_stage: [1, 1]}
  - {name: text_encoder, role: encoder, tp: 1, pp: 2, dp: 1, first_device: 0, devices: 2, first_stage: 0,
     microbatch_size: 16, layers_per_stage: [1, 1]}
"""


def setUpModule():
    if not CLI or not MPIEXEC:
        raise unittest.SkipTest("set BRAID_CLI and BRAID_MPIEXEC")


def train(ranks, *args, timeout=600, env=None):
    # One thread, braid's and OpenBLAS's, in every process: a GEMM's bits can depend on
    # OpenBLAS's count, and runs of different process counts are compared bit for bit.
    cmd = [CLI, "train", "--threads", "1", *args]
    if ranks > 1:
        cmd = [*MPIEXEC, "-n", str(ranks), *cmd]
    return subprocess.run(cmd, cwd=SOURCE_DIR, capture_output=True, text=True, timeout=timeout, env=env)


def refused(test, args, message):
    """`braid ARGS` (one process, as given) exits 2 with `message` on stderr."""
    r = subprocess.run([CLI, *args], cwd=SOURCE_DIR, capture_output=True, text=True, timeout=120)
    test.assertEqual(r.returncode, 2, r.stderr)
    test.assertIn(message, r.stderr)


def check(test, result):
    test.assertEqual(result.returncode, 0, "braid train failed:\n" + result.stdout + result.stderr)


def variant(directory, base, name, **trainer):
    """A copy of a run file with `trainer:` settings (and `training=` overrides) merged in."""
    training = trainer.pop("training", {})
    with open(base) as f:
        text = f.read()
    text = text.replace("model: ../", "model: " + os.path.join(SOURCE_DIR, "configs") + "/")
    text = text.replace("cluster: ../", "cluster: " + os.path.join(SOURCE_DIR, "configs") + "/")
    settings = {}
    if "\ntrainer:\n" in text:  # the section is the file's last
        text, section = text.split("\ntrainer:\n", 1)
        text += "\n"
        for line in section.splitlines():
            if line.startswith("  ") and ":" in line:
                key, value = line.strip().split(":", 1)
                settings[key] = value.strip()
    settings.update(trainer)
    for key, value in training.items():
        lines = [l for l in text.splitlines() if not l.strip().startswith(key + ":")]
        lines.insert(lines.index("training:") + 1, f"  {key}: {value}")
        text = "\n".join(lines) + "\n"
    if settings:
        text += "trainer:\n" + "".join(f"  {k}: {v}\n" for k, v in settings.items())
    path = os.path.join(directory, name)
    with open(path, "w") as f:
        f.write(text)
    return path


def metrics(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def losses(path):
    return [m["loss"] for m in metrics(path) if not any(m.get(k) for k in ("eval", "summary", "memory", "op_profile"))]


def read_checkpoint(path, shapes=False):
    """Tensors of one braid checkpoint file (format of core/train/checkpoint.hpp); with
    `shapes`, each as (dims, values)."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"BRAIDCKP", path
    at = 40
    (meta_len,) = struct.unpack_from("<I", data, at)
    at += 4 + meta_len
    tensors, _blobs = struct.unpack_from("<II", data, at)
    at += 8
    out = {}
    for _ in range(tensors):
        (n,) = struct.unpack_from("<I", data, at)
        name = data[at + 4 : at + 4 + n].decode()
        at += 4 + n
        (ndim,) = struct.unpack_from("<I", data, at)
        dims = struct.unpack_from("<" + "q" * ndim, data, at + 4)
        at += 4 + 8 * ndim
        count = math.prod(dims)
        values = struct.unpack_from("<" + "f" * count, data, at)
        out[name] = (dims, values) if shapes else values
        at += 4 * count
    return out


def join_slices(slices, axis, shape):
    """The whole tensor (flat, row-major) of a parameter of one slice's `shape` whose
    tensor-parallel slices along `axis` are `slices` [index] (core/train/sharded_state.hpp)."""
    count = len(slices)
    if axis == 0:
        return [v for s in slices for v in s]
    rows, cols = shape
    return [slices[k][r * cols + c] for r in range(rows) for k in range(count) for c in range(cols)]


def gradients(directory, step, world):
    """Every parameter's reduced gradient at `step`, merged over the ranks' shards: a whole
    tensor from the first rank that holds it, tensor-parallel slices joined."""
    names = [f"step-{step:06d}.braidckpt"] if world == 1 else [
        f"step-{step:06d}.rank-{rank:04d}.braidckpt" for rank in range(world)]
    merged, sliced = {}, {}
    for name in names:
        for entry, (dims, values) in read_checkpoint(os.path.join(directory, name), shapes=True).items():
            key, _, where = entry.partition("@")
            if not where:
                merged.setdefault(key, values)
                continue
            axis, index_count = where.split(":")
            index, count = map(int, index_count.split("/"))
            sliced.setdefault(key, (int(axis), dims, [None] * count))[2][index] = values
    for key, (axis, dims, slices) in sliced.items():
        assert all(s is not None for s in slices), f"{key}: a slice is missing"
        assert all(len(s) == len(slices[0]) for s in slices), f"{key}: slices of different sizes"
        merged[key] = join_slices(slices, axis, dims)
    return merged


def norm(values):
    return math.sqrt(sum(v * v for v in values))


def relative_error(a, b, floor=1e-30):
    """||a - b|| / ||b||, the norm floored at `floor`: a tensor whose gradient is zero in exact
    arithmetic (attention's key bias: the softmax cancels it) holds only rounding noise."""
    return norm([x - y for x, y in zip(a, b)]) / max(norm(b), floor)


# Instructions that may run ahead of a wait under optimus-online: encoder tasks and the
# ordering messages of the encoder's side (its tokens out, their gradients back in).
def movable(event):
    args = event["args"]
    return args["op"] == "EncoderTask" or (args.get("ordering_only") and args["op"] in ("SendActivation", "RecvGrad"))


def executed(trace_path):
    """Per rank of a `braid train --trace` file: its stage's instruction count and the
    instruction events in the order they started."""
    with open(trace_path) as f:
        doc = json.load(f)
    counts = [s["instructions"] for s in doc["otherData"]["stages"]]
    stage_of = {e["pid"]: e["args"]["stage"] for e in doc["traceEvents"] if e.get("name") == "process_name"}
    ran = {}
    for e in doc["traceEvents"]:
        if e.get("ph") == "X":
            ran.setdefault(e["pid"], []).append(e)
    return {pid: (counts[stage_of[pid]], sorted(events, key=lambda e: e["ts"])) for pid, events in ran.items()}


class LayoutEquivalence(unittest.TestCase):
    """3 steps of each layout and schedule against one process: losses and every parameter's
    gradient; and each rank ran its stage's instruction list of the plan's program, once each
    and in order (under optimus-online, movable instructions may run early, in their own order)."""

    steps = 3

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.reference = {}

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def run_layout(self, config, ranks, name, *args):
        d = os.path.join(self.tmp.name, name)
        os.makedirs(d)
        r = train(ranks, "--config", config, "--steps", str(self.steps), "--quiet", "--metrics", d + "/m.jsonl",
                  "--dump-gradients", d + "/grads", "--trace", d + "/trace.json", *args)
        check(self, r)
        return d

    def single(self, config, *args):
        key = (config, args)
        if key not in self.reference:
            self.reference[key] = self.run_layout(config, 1, f"single{len(self.reference)}", *args)
        return self.reference[key]

    def check_executed(self, d, ranks, online):
        per_rank = executed(d + "/trace.json")
        self.assertEqual(sorted(per_rank), list(range(ranks)), "every rank's last step is in the trace")
        for rank, (count, events) in per_rank.items():
            order = [e["args"]["index"] for e in events]
            self.assertEqual(sorted(order), list(range(count)), f"rank {rank} ran each instruction once")
            if not online:
                self.assertEqual(order, list(range(count)), f"rank {rank} ran its program in order")
                continue
            fixed = [e["args"]["index"] for e in events if not movable(e)]
            early = [e["args"]["index"] for e in events if movable(e)]
            self.assertEqual(fixed, sorted(fixed), f"rank {rank}: the llm's instructions in program order")
            self.assertEqual(early, sorted(early), f"rank {rank}: encoder work in program order among itself")
        return per_rank

    def assert_same(self, config, ranks, *args, reference_args=()):
        ref = self.single(config, *reference_args)
        name = "-".join([os.path.basename(config), str(ranks), *args]).replace("/", "_")
        got = self.run_layout(config, ranks, name, *args)
        ref_losses, got_losses = losses(ref + "/m.jsonl"), losses(got + "/m.jsonl")
        self.assertEqual(len(got_losses), self.steps)
        for step, (a, b) in enumerate(zip(got_losses, ref_losses), 1):
            self.assertLessEqual(abs(a - b) / abs(b), TOLERANCE, f"step {step}: loss {a} vs {b}")
        for step in range(1, self.steps + 1):
            want = gradients(ref + "/grads", step, 1)
            have = gradients(got + "/grads", step, ranks)
            self.assertEqual(set(have), set(want), f"step {step}: the ranks together hold every parameter")
            total = norm([v for values in want.values() for v in values])
            for name in want:
                self.assertEqual(len(have[name]), len(want[name]), f"step {step}: {name}: the slices make the whole")
                self.assertLessEqual(relative_error(have[name], want[name], 1e-3 * total), TOLERANCE,
                                     f"step {step}: {name}")
        per_rank = self.check_executed(got, ranks, online="optimus-online" in args)
        return got, per_rank

    def assert_schedules(self, config, ranks, schedules, *args):
        """Each schedule against one process; returns {schedule: (run dir, executed)}."""
        out = {}
        for schedule in schedules:
            with self.subTest(schedule=schedule):
                out[schedule] = self.assert_same(config, ranks, *args, "--schedule", schedule)
        return out

    def test_clip_data_parallel_2(self):
        self.assert_schedules(CLIP, 2, ["batch-sync", "distmm-pipe", "two-phase"])

    def test_clip_data_parallel_4(self):
        self.assert_same(CLIP, 4)

    def test_clip_data_parallel_with_two_contrastive_groups(self):
        # Each group is split over the replicas on its own: before, the batch was, and group 0
        # of 2 replicas held other samples than of one process (losses 1e-3 apart).
        config = variant(self.tmp.name, CLIP, "clip-dp-groups.yaml", training={"contrastive_batch": 64})
        self.assert_same(config, 2)

    def test_clip_distmm_2(self):
        self.assert_schedules(CLIP, 2, ["distmm-pipe", "batch-sync", "two-phase"], "--strategy", "distmm")

    def test_clip_distmm_unequal_towers(self):
        # One image rank, two text ranks: the towers split the batch differently (and only the
        # text tower's two replicas are reordered), the batch-sync matches rows by sample.
        plan = os.path.join(self.tmp.name, "distmm-1-2.yaml")
        with open(plan, "w") as f:
            f.write(DISTMM_1_2)
        self.assert_same(CLIP, 3, "--plan", plan)

    def test_clip_distmm_pipe_two_groups(self):
        config = variant(self.tmp.name, CLIP, "clip-groups.yaml", training={"contrastive_batch": 64})
        self.assert_schedules(config, 2, ["distmm-pipe", "two-phase"], "--strategy", "distmm")

    def test_clip_towers_pipelined(self):
        # Four contrastive groups: under DistMM-Pipe group g's forwards run while g-1's
        # gradients travel back; two-phase recomputes each stage's forward before its backward.
        plan = os.path.join(self.tmp.name, "clip-pp2.yaml")
        with open(plan, "w") as f:
            f.write(CLIP_PP2)
        config = variant(self.tmp.name, CLIP, "clip-4-groups.yaml", training={"contrastive_batch": 32})
        self.assert_schedules(config, 2, ["batch-sync", "distmm-pipe", "two-phase"], "--plan", plan)

    def test_clip_tensor_parallel(self):
        # Both towers split by TP (the text tower's token table by vocabulary): TP 2 and 4 alone,
        # TP 2 x DP 2, each TP index's ranks forming a batch-sync of their own; then with each
        # tower in 2 pipeline stages, and with ZeRO-3 over the DP groups.
        self.assert_same(CLIP, 2, "--tp", "2")
        self.assert_same(CLIP, 4, "--tp", "4")
        self.assert_same(CLIP, 4, "--tp", "2")
        plan = os.path.join(self.tmp.name, "clip-tp2-pp2.yaml")
        with open(plan, "w") as f:
            f.write(CLIP_PP2.replace("devices: 2", "devices: 4").replace("tp: 1, pp: 2", "tp: 2, pp: 2"))
        self.assert_same(CLIP, 4, "--plan", plan)
        self.assert_same(self.zero_variant(CLIP, 3), 4, "--tp", "2")

    def test_sequence_parallel(self):
        # Megatron's sequence parallelism where the run file asks for it: norms and residuals on
        # each TP rank's positions (causal sequences padded to split; the image encoder's
        # sequences split only when their patches divide). The llm with the encoder and projector
        # in TP 2 and TP 2 x PP 2; Optimus's llm (its colocated encoder runs kernel by kernel,
        # whole sequences); both CLIP towers.
        mllm = variant(self.tmp.name, MLLM, "mllm-sp.yaml", training={"sequence_parallel": "true"})
        clip = variant(self.tmp.name, CLIP, "clip-sp.yaml", training={"sequence_parallel": "true"})
        self.assert_same(mllm, 2, "--strategy", "megatron", "--tp", "2")
        self.assert_same(mllm, 4, "--strategy", "megatron", "--tp", "2", "--pp", "2")
        self.assert_same(mllm, 4, "--strategy", "optimus", "--pp", "2", "--tp", "2", "--schedule", "optimus-fine")
        self.assert_same(clip, 2, "--tp", "2")

    def test_clip_towers_chained_as_stages_are_refused(self):
        # Megatron's plan with pp 2 puts one tower on each stage: nothing flows between them.
        # Each rank finds it of its own tower before making its groups: said once, no abort.
        r = train(2, "--config", CLIP, "--steps", "1", "--strategy", "megatron", "--pp", "2")
        self.assertEqual(r.returncode, 2)
        self.assertIn("the CPU trainer pipelines a CLIP tower over stages that each hold a part of it", r.stderr)
        self.assertEqual(r.stderr.count("braid: error:"), 1, r.stderr)
        self.assertNotIn("MPI_ABORT", r.stderr)

    def test_a_process_count_without_a_plan_is_told_the_counts_that_have_one(self):
        # 3 ranks do not split tiny-clip's batch of 128 at tp 1, pp 1 (braid train's default).
        r = train(3, "--config", CLIP, "--steps", "1")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("braid train plans tp 1 and pp 1 where --tp and --pp do not say otherwise; it plans on 2 or 4 "
                      "processes", r.stderr)
        self.assertEqual(r.stderr.count("no plan fits"), 1, r.stderr)  # said once, not per rank

    def test_plan_microbatch_size_runs_as_planned(self):
        # The run file says 16 per microbatch, the plan 8: twice the microbatches, the same step.
        plan = os.path.join(self.tmp.name, "clip-pp2-mb8.yaml")
        with open(plan, "w") as f:
            f.write(CLIP_PP2.replace("microbatch_size: 16", "microbatch_size: 8"))
        _, per_rank = self.assert_same(CLIP, 2, "--plan", plan)
        forwards = [e for e in per_rank[0][1] if e["args"]["op"] == "Forward"]
        self.assertEqual(len(forwards), 128 // 8)

    def test_plan_microbatch_size_that_cannot_split_is_refused_by_line(self):
        plan = os.path.join(self.tmp.name, "clip-pp2-mb5.yaml")
        with open(plan, "w") as f:
            f.write(CLIP_PP2.replace("microbatch_size: 16", "microbatch_size: 5"))
        r = train(2, "--config", CLIP, "--steps", "1", "--plan", plan)
        self.assertEqual(r.returncode, 2)
        self.assertRegex(r.stderr, r"clip-pp2-mb5\.yaml:\d+:\d+: modules\[0\]\.microbatch_size: microbatches of 5 on "
                                   r"1 DP replicas do not split the contrastive batch of 128")

    def test_mllm_data_parallel_2(self):
        self.assert_schedules(MLLM, 2, ["1f1b", "gpipe"])

    def test_mllm_colocated_every_schedule(self):
        # Optimus's layout: the encoder data parallel over both ranks, the llm in 2 stages; the
        # encoder runs kernel by kernel as the bubble scheduler's tasks. The programs only
        # reorder work; online filling moves encoder tasks but keeps their order among
        # themselves and the llm's, so every parameter sums its gradients in the fine
        # program's order: the same losses, bit for bit.
        runs = self.assert_schedules(MLLM, 2, ["encoder-first", "optimus-coarse", "optimus-fine", "optimus-online"],
                                     "--strategy", "optimus", "--pp", "2")
        for schedule, (_, per_rank) in runs.items():
            for rank, (_, events) in per_rank.items():
                self.assertTrue(any(e["args"]["op"] == "EncoderTask" for e in events), f"{schedule} rank {rank}")
        self.assertEqual(losses(runs["optimus-online"][0] + "/m.jsonl"), losses(runs["optimus-fine"][0] + "/m.jsonl"))

    def test_recomputation_changes_no_bit_and_keeps_less(self):
        # Full recomputation keeps each block's input and runs its forward again before its
        # backward; selective recomputes the attention probabilities (tiny-mllm's attention is
        # standard). One process: the losses and gradients of no recomputation, bit for bit,
        # with fewer activations kept, as the cost model predicts. Then a pipeline with TP, and
        # the colocated encoder run kernel by kernel, against one process.
        plain = self.single(MLLM)
        kept = {}
        for recompute in ("full", "selective"):
            with self.subTest(recompute=recompute):
                config = variant(self.tmp.name, MLLM, f"mllm-recompute-{recompute}.yaml",
                                 training={"recompute": recompute})
                mine = self.single(config)
                self.assertEqual(losses(mine + "/m.jsonl"), losses(plain + "/m.jsonl"))
                for step in range(1, self.steps + 1):
                    self.assertEqual(gradients(mine + "/grads", step, 1), gradients(plain + "/grads", step, 1))
                for name, d in (("none", plain), (recompute, mine)):
                    memory = next(m for m in metrics(d + "/m.jsonl") if m.get("memory"))["ranks"][0]
                    kept[name] = (memory["measured_bytes"]["activations"], memory["predicted_bytes"]["activations"])
                self.assertLess(kept[recompute][0], kept["none"][0])
                self.assertLess(kept[recompute][1], kept["none"][1])
                self.assert_same(config, 4, "--strategy", "megatron", "--pp", "2", "--tp", "2")
                self.assert_same(config, 2, "--strategy", "optimus", "--pp", "2", "--schedule", "optimus-fine")
        print("activations kept (measured, predicted bytes):", kept, file=sys.stderr)
        # CLIP's towers (the text encoder causal), under two-phase's own recomputing forward too.
        config = variant(self.tmp.name, CLIP, "clip-recompute-full.yaml", training={"recompute": "full"})
        self.assertEqual(losses(self.single(config) + "/m.jsonl"), losses(self.single(CLIP) + "/m.jsonl"))
        self.assert_same(config, 2, "--schedule", "two-phase")

    def test_mllm_colocated_llm_tensor_parallel(self):
        # 4 ranks: the llm 2 stages x TP 2, the encoder on every rank with TP 1: each TP pair
        # of a stage shares its lane's samples and exchanges the tokens.
        self.assert_schedules(MLLM, 4, ["optimus-fine", "optimus-online"], "--strategy", "optimus", "--pp", "2",
                              "--tp", "2")

    def test_mllm_llm_tensor_parallel(self):
        # Layout (c): the llm's blocks split over 2 tensor-parallel ranks.
        self.assert_same(MLLM, 2, "--strategy", "megatron", "--tp", "2")

    def test_mllm_every_module_tensor_parallel_4(self):
        # Megatron's plan on 4 ranks with TP 4: the encoder, the projector and the llm each hold a
        # quarter of every split tensor (4 heads: one per rank; a vocabulary of 32: 8 per rank).
        self.assert_same(MLLM, 4, "--strategy", "megatron", "--tp", "4")

    def test_mllm_tensor_and_pipeline_parallel(self):
        # TP 2 x PP 2: the encoder and projector sharded in the first stage, the llm in both.
        self.assert_same(MLLM, 4, "--strategy", "megatron", "--tp", "2", "--pp", "2")

    def zero_variant(self, base, stage):
        return variant(self.tmp.name, base, f"{os.path.basename(base)}-zero{stage}.yaml",
                       training={"zero_stage": stage})

    def test_mllm_zero_stages(self):
        # ZeRO 1-3 over the llm's, the encoder's and the projector's DP groups: data parallel on
        # 2 ranks, and with TP 2 and PP 2 on 4; every reduced gradient gathered from the shards.
        for stage in (1, 2, 3):
            config = self.zero_variant(MLLM, stage)
            with self.subTest(zero=stage):
                self.assert_same(config, 2)
                self.assert_same(config, 4, "--strategy", "megatron", "--tp", "2")
                self.assert_same(config, 4, "--strategy", "megatron", "--pp", "2")

    def test_mllm_zero_disaggregated_and_colocated(self):
        # DistTrain's encoder replicas shard over their own DP group; Optimus's colocated encoder
        # runs ZeRO-1 (its encoder tasks sit at other places in each stage's program).
        for stage in (1, 3):
            with self.subTest(zero=stage):
                self.assert_same(self.zero_variant(MLLM, stage), 4, "--strategy", "disttrain")
        self.assert_same(self.zero_variant(MLLM, 1), 4, "--strategy", "optimus", "--pp", "2")
        # Online, the llm's reduce-scatters go out unit by unit between the encoder tasks that
        # run in its DP wait.
        self.assert_same(self.zero_variant(MLLM, 1), 4, "--strategy", "optimus", "--pp", "2", "--schedule",
                         "optimus-online")

    def test_zero3_replicas_with_other_numbers_of_image_sides(self):
        # Unreordered, seed 5 gives the two replicas' microbatches other numbers of image sides:
        # ZeRO-3 gathered each block at its first use and reduced it after its last, so the
        # replicas' collectives crossed (a heap corruption here, a hang with 2 encoder replicas
        # feeding one llm). Every unit is now gathered as a backward starts.
        config = self.zero_variant(MLLM, 3)
        self.assert_same(config, 2, "--no-reorder", "--seed", "5", reference_args=("--no-reorder", "--seed", "5"))

    def test_clip_zero_stages(self):
        # Both towers on every rank (their DP groups the same ranks), and DistMM's towers apart.
        for stage in (1, 2, 3):
            config = self.zero_variant(CLIP, stage)
            with self.subTest(zero=stage):
                self.assert_same(config, 2)
                self.assert_same(config, 4, "--strategy", "distmm")

    def test_mllm_megatron_pipeline(self):
        # The encoder and projector run in the first stage's forward and backward.
        self.assert_schedules(MLLM, 2, ["1f1b", "gpipe"], "--strategy", "megatron", "--pp", "2")

    def test_mllm_disaggregated_encoder(self):
        # DistTrain: encoder and projector on ranks of their own, a stage of the llm's pipeline.
        self.assert_schedules(MLLM, 2, ["1f1b", "gpipe"], "--strategy", "disttrain")

    def test_mllm_colocated_4_ranks(self):
        # 4 ranks: the encoder on every rank (4 replicas), 2 llm replicas of 2 stages each.
        self.assert_same(MLLM, 4, "--strategy", "optimus", "--pp", "2")

    def test_mllm_disaggregated_fan_in_and_encoder_tp(self):
        # DistTrain on 4 ranks: 2 encoder replicas fan in to one llm replica of 2 stages; then
        # one encoder replica over 2 TP ranks (run replicated, one of them sends).
        plan = os.path.join(self.tmp.name, "disttrain-fan-in.yaml")
        with open(plan, "w") as f:
            f.write(DISTTRAIN_FAN_IN)
        self.assert_same(MLLM, 4, "--plan", plan)
        plan_tp = os.path.join(self.tmp.name, "disttrain-encoder-tp.yaml")
        with open(plan_tp, "w") as f:
            f.write(DISTTRAIN_FAN_IN.replace("tp: 1, pp: 1, dp: 2, first_device: 0, devices: 2, first_stage: 0,\n"
                                             "     microbatch_size: 2",
                                             "tp: 2, pp: 1, dp: 1, first_device: 0, devices: 2, first_stage: 0,\n"
                                             "     microbatch_size: 4"))
        self.assert_same(MLLM, 4, "--plan", plan_tp)


def contents(directory, *others):
    """Every file of `directory` (and the files `others`) by name: its bytes."""
    out = {}
    for name in sorted(os.listdir(directory)) + list(others):
        with open(os.path.join(directory, name), "rb") as f:
            out[name] = f.read()
    return out


class Checkpoints(unittest.TestCase):
    def test_resume_is_bit_identical_and_skips_a_corrupted_checkpoint(self):
        with tempfile.TemporaryDirectory() as d:
            config = variant(d, CLIP, "clip.yaml", checkpoint_every=3, eval_every=0, eval_samples=32)
            check(self, train(2, "--config", config, "--steps", "9", "--quiet", "--metrics", d + "/full.jsonl",
                              "--checkpoint-dir", d + "/ckpt"))
            # Corrupt the newest checkpoint (step 9): one flipped byte in a shard.
            shard = os.path.join(d, "ckpt", "step-000009.rank-0001.braidckpt")
            with open(shard, "r+b") as f:
                f.seek(100)
                byte = f.read(1)
                f.seek(100)
                f.write(bytes([byte[0] ^ 0xFF]))
            shutil.copy(d + "/full.jsonl", d + "/resumed.jsonl")
            r = train(2, "--config", config, "--steps", "9", "--quiet", "--metrics", d + "/resumed.jsonl",
                      "--checkpoint-dir", d + "/ckpt", "--resume")
            check(self, r)
            self.assertIn("step-000009", r.stderr)
            self.assertIn("checksum", r.stderr)
            self.assertIn("resuming from step-000006", r.stderr)
            full, resumed = losses(d + "/full.jsonl"), losses(d + "/resumed.jsonl")
            self.assertEqual(len(resumed), 9)
            self.assertEqual(full, resumed, "steps 7-9 after resuming equal the uninterrupted run bit for bit")

    def test_a_directory_of_checkpoints_is_kept_for_its_run(self):
        with tempfile.TemporaryDirectory() as d:
            config = variant(d, CLIP, "clip.yaml", checkpoint_every=1, eval_every=0, eval_samples=8)
            ckpt, link = d + "/ckpt", d + "/m.jsonl"
            os.symlink(d + "/metrics.jsonl", link)
            check(self, train(2, "--config", config, "--steps", "2", "--quiet", "--metrics", link,
                              "--checkpoint-dir", ckpt))
            def files():
                return contents(ckpt)

            before = files()
            # Without --resume a run would write over them: refused, nothing touched.
            r = train(2, "--config", config, "--steps", "2", "--seed", "2", "--checkpoint-dir", ckpt)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn(f"checkpoint directory '{ckpt}' already holds checkpoints (up to step-000002.braidckpt): "
                          "continue them with --resume", r.stderr)
            self.assertEqual(files(), before)
            # While a run holds the directory another is refused (here the lock is this test's).
            import fcntl
            with open(os.path.join(ckpt, ".lock")) as held:
                fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
                r = train(2, "--config", config, "--steps", "3", "--checkpoint-dir", ckpt, "--resume")
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn(f"checkpoint directory '{ckpt}' is in use by another run", r.stderr)
            # Resumed, the metrics read as one run: one summary, one memory record; the link stays.
            check(self, train(2, "--config", config, "--steps", "3", "--quiet", "--metrics", link,
                              "--checkpoint-dir", ckpt, "--resume"))
            self.assertTrue(os.path.islink(link))
            records = metrics(link)
            run_records = ("eval", "summary", "memory", "op_profile")
            self.assertEqual([m["step"] for m in records if not any(m.get(k) for k in run_records)], [1, 2, 3])
            self.assertEqual(sum(1 for m in records if m.get("summary")), 1)
            self.assertEqual(sum(1 for m in records if m.get("memory")), 1)
            # Nothing left to train: where the run stands, its metrics (summary included) and its
            # trace untouched (the trace was written over with one of no events).
            with open(link) as f:
                finished = f.read()
            trace = os.path.join(d, "trace.json")
            with open(trace, "w") as f:
                f.write("the last step's trace\n")
            r = train(2, "--config", config, "--steps", "3", "--checkpoint-dir", ckpt, "--resume", "--metrics", link,
                      "--trace", trace)
            check(self, r)
            self.assertIn("nothing to train: the run is at step 3 of 3", r.stdout + r.stderr)
            self.assertIn(f"no step ran: the trace is left as it was: {trace}", r.stdout)
            with open(link) as f:
                self.assertEqual(f.read(), finished)
            with open(trace) as f:
                self.assertEqual(f.read(), "the last step's trace\n")

    def test_damaged_checkpoints_are_never_written_over_nor_pruned_in_place_of_good_ones(self):
        def flip(path):
            with open(path, "r+b") as f:
                f.seek(100)
                byte = f.read(1)
                f.seek(100)
                f.write(bytes([byte[0] ^ 0xFF]))

        with tempfile.TemporaryDirectory() as d:
            config = variant(d, CLIP, "clip.yaml", checkpoint_every=2, keep_checkpoints=2, eval_every=0,
                             eval_samples=8)
            ckpt, log = d + "/ckpt", d + "/m.jsonl"
            check(self, train(1, "--config", config, "--steps", "5", "--quiet", "--metrics", log,
                              "--checkpoint-dir", ckpt))
            self.assertEqual(sorted(os.listdir(ckpt)), [".lock", "step-000004.braidckpt", "step-000005.braidckpt"])
            # The newest (the last step's) damaged: resumed from step 4, and the checkpoint of step 6
            # (not of 5) prunes to 2 good ones, keeping step 4, not the damaged 5 alone.
            flip(os.path.join(ckpt, "step-000005.braidckpt"))
            r = train(1, "--config", config, "--steps", "6", "--quiet", "--metrics", log, "--checkpoint-dir", ckpt,
                      "--resume")
            check(self, r)
            self.assertIn("resuming from step-000004", r.stderr)
            self.assertEqual(sorted(os.listdir(ckpt)),
                             [".lock", "step-000004.braidckpt", "step-000005.braidckpt", "step-000006.braidckpt"])
            # Every one damaged: refused, nothing written over (checkpoints, metrics).
            for step in (4, 6):
                flip(os.path.join(ckpt, f"step-00000{step}.braidckpt"))
            def files():
                return contents(ckpt, log)
            before = files()
            r = train(1, "--config", config, "--steps", "7", "--metrics", log, "--checkpoint-dir", ckpt, "--resume")
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn(f"--resume: no checkpoint in '{ckpt}' is usable (listed above); nothing was changed",
                          r.stderr)
            self.assertEqual(files(), before)
            # Gradient dumps are named as checkpoints: not in the checkpoint directory.
            r = train(1, "--config", config, "--steps", "1", "--checkpoint-dir", d + "/fresh",
                      "--dump-gradients", d + "/fresh/")
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn("is the checkpoint directory", r.stderr)
            r = train(2, "--config", config, "--steps", "1", "--checkpoint-dir", d + "/fresh",
                      "--dump-gradients", d + "/fresh/")
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertEqual(r.stderr.count("is the checkpoint directory"), 1, r.stderr)  # said once
            self.assertNotIn("MPI_ABORT", r.stderr)
            # A write that fails inside a step (a directory where the dump goes) is said once.
            os.makedirs(d + "/dumps/step-000001.braidckpt")
            r = train(1, "--config", config, "--steps", "1", "--dump-gradients", d + "/dumps")
            self.assertNotEqual(r.returncode, 0)
            self.assertEqual(r.stderr.count("braid: error:"), 1, r.stderr)

    def test_a_resume_under_another_learning_rate_schedule_is_refused_unless_asked_for(self):
        with tempfile.TemporaryDirectory() as d:
            config = variant(d, CLIP, "clip.yaml", warmup_steps=1, checkpoint_every=3, eval_every=0, eval_samples=8)
            ckpt, log = d + "/ckpt", d + "/m.jsonl"
            check(self, train(1, "--config", config, "--steps", "3", "--quiet", "--metrics", log,
                              "--checkpoint-dir", ckpt))
            def files():
                return contents(ckpt, log)
            before = files()
            # Steps 2-3 went down a cosine of 3 steps, not of 4: refused on 2 ranks, said once,
            # nothing changed.
            r = train(2, "--config", config, "--steps", "4", "--metrics", log, "--checkpoint-dir", ckpt, "--resume")
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn(f"--resume: checkpoint '{ckpt}/step-000003.braidckpt' was trained under a learning-rate "
                          "schedule of 3 steps (peak 0.001, warm-up 1 step, floor 0.1 of the peak), this run's is "
                          "of 4 steps", r.stderr)
            self.assertIn("its step 2 trained at", r.stderr)
            self.assertIn("or pass --override-lr-schedule", r.stderr)
            self.assertEqual(r.stderr.count("braid: error:"), 1, r.stderr)
            self.assertNotIn("MPI_ABORT", r.stderr)
            self.assertEqual(files(), before)
            # Asked for: step 4 trains on the 4-step schedule.
            r = train(2, "--config", config, "--steps", "4", "--quiet", "--metrics", log, "--checkpoint-dir", ckpt,
                      "--resume", "--override-lr-schedule")
            check(self, r)
            self.assertIn("--override-lr-schedule: checkpoint", r.stderr)
            self.assertEqual(len(losses(log)), 4)
            r = train(1, "--config", config, "--steps", "4", "--checkpoint-dir", ckpt, "--override-lr-schedule")
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn("--override-lr-schedule needs --resume", r.stderr)

    def test_a_link_to_nowhere_is_no_checkpoint_directory(self):
        with tempfile.TemporaryDirectory() as d:
            os.symlink(d + "/gone", d + "/ckpt")
            r = train(1, "--config", CLIP, "--steps", "1", "--checkpoint-dir", d + "/ckpt")
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn(f"it is a link to '{d}/gone', which does not exist", r.stderr)

    def test_resume_without_checkpoint_dir_is_refused(self):
        r = train(1, "--config", CLIP, "--resume")
        self.assertEqual(r.returncode, 2)
        self.assertIn("--resume needs --checkpoint-dir", r.stderr)

    def test_a_trace_that_cannot_be_written_is_refused_before_training(self):
        with tempfile.TemporaryDirectory() as d:
            metrics = os.path.join(d, "m.jsonl")
            r = train(2, "--config", CLIP, "--steps", "2", "--metrics", metrics, "--trace", d + "/missing/t.json")
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn(f"cannot write the trace to '{d}/missing/t.json': no directory '{d}/missing'", r.stderr)
            self.assertNotIn("step 1/2", r.stdout + r.stderr)
            self.assertFalse(os.path.exists(metrics), "nothing was started, nothing written")

    def test_pipeline_plan_is_refused_with_the_reason(self):
        r = train(1, "--config", MLLM, "--steps", "1", "--pp", "2")
        self.assertEqual(r.returncode, 3)
        self.assertIn("tp 1 x pp 2 does not divide the 1 devices", r.stderr)


class Resharding(unittest.TestCase):
    """A checkpoint written by TP 2 x DP 2 on 4 ranks resumes under another layout and world
    size (every shard read, the tensor-parallel slices joined whole, each rank's own slices cut
    again) with the losses of the uninterrupted run: the same layout bit for bit, DP 4 on 4
    ranks and TP 1 x PP 2 on 2 ranks within a relative 1e-6. A copy of the run file elsewhere
    continues the run; a checkpoint of another run (another seed, other data) is refused."""

    TP2_DP2 = ("--strategy", "megatron", "--tp", "2")
    ZERO = 0  # the run file's zero_stage

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        d = cls.tmp.name
        # Checkpoints at steps 2 and 4; the one evaluation (at the end) on a few samples.
        cls.config = variant(d, MLLM, "mllm.yaml", checkpoint_every=2, eval_every=0, eval_samples=8,
                             training={"zero_stage": cls.ZERO})
        r = train(4, "--config", cls.config, *cls.TP2_DP2, "--steps", "4", "--quiet", "--metrics",
                  d + "/full.jsonl", "--checkpoint-dir", d + "/ckpt")
        if r.returncode != 0:
            raise AssertionError("braid train failed:\n" + r.stdout + r.stderr)
        cls.full = losses(d + "/full.jsonl")
        assert len(cls.full) == 4, cls.full

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def resume(self, name, ranks, *layout, seed=None, config=None):
        """Steps 3-4 resumed from a copy of the run's step-2 checkpoint: (losses, result)."""
        d = self.tmp.name
        ckpt = os.path.join(d, "ckpt-" + name)
        shutil.copytree(d + "/ckpt", ckpt)
        for f in os.listdir(ckpt):
            if f.startswith("step-000004"):
                os.remove(os.path.join(ckpt, f))
        path = os.path.join(d, name + ".jsonl")
        shutil.copy(d + "/full.jsonl", path)
        extra = ["--seed", str(seed)] if seed is not None else []
        r = train(ranks, "--config", config or self.config, *layout, *extra, "--steps", "4", "--quiet", "--metrics",
                  path, "--checkpoint-dir", ckpt, "--resume")
        return (losses(path) if r.returncode == 0 else None), r

    def expect_close(self, resumed, layout):
        self.assertEqual(len(resumed), 4)
        self.assertEqual(resumed[:2], self.full[:2], "steps 1-2 are kept from the metrics file")
        for step, (a, b) in enumerate(zip(resumed[2:], self.full[2:]), start=3):
            self.assertLessEqual(abs(a - b) / abs(b), 1e-6, f"{layout}, step {step}: {a!r} against {b!r}")

    def test_the_same_layout_reads_its_own_shards_bit_for_bit(self):
        resumed, r = self.resume("same", 4, *self.TP2_DP2)
        check(self, r)
        self.assertIn("resuming from step-000002", r.stderr)
        self.assertNotIn("resharding", r.stderr)
        self.assertEqual(resumed, self.full, "steps 3-4 after resuming equal the uninterrupted run bit for bit")

    # Another layout is not bit for bit against the uninterrupted run: the restored state is
    # (the unit tests join and cut it bit for bit), but the steps after it sum in another order:
    # the TP 2 run splits the inner sums of its row-parallel matmuls in two halves and
    # all-reduces them, DP 4 sums the gradients and losses of four replicas instead of two, a
    # pipeline accumulates all microbatches on one rank. Measured: 1e-8 relative at steps 3-4
    # (DP 4: 9.6e-9, 1.0e-8; TP 1 x PP 2: 4.8e-9, 1.0e-8), under the 1e-6 asserted. Where the
    # order is the same, resharded runs agree bit for bit: TP 1 x PP 2 against one process.
    def test_data_parallel_4_resumes_a_tp2_dp2_checkpoint(self):
        resumed, r = self.resume("dp4", 4, "--strategy", "megatron", "--tp", "1")
        check(self, r)
        self.assertIn("resharding checkpoint step-000002 from world 4 (strategy megatron; tp 2, pp 1, dp 2) "
                      "to world 4 (strategy megatron; tp 1, pp 1, dp 4)", r.stderr)
        self.expect_close(resumed, "dp 4")

    def test_pipeline_2_on_2_ranks_resumes_a_tp2_dp2_checkpoint(self):
        resumed, r = self.resume("pp2", 2, "--strategy", "megatron", "--pp", "2")
        check(self, r)
        self.assertIn("resharding checkpoint step-000002 from world 4 (strategy megatron; tp 2, pp 1, dp 2) "
                      "to world 2 (strategy megatron; tp 1, pp 2, dp 1", r.stderr)
        self.expect_close(resumed, "tp 1 x pp 2")
        # A pipeline runs each microbatch's layers as one process does and accumulates the
        # gradients and the loss in microbatch order: the same arithmetic from the same state
        # (and OpenBLAS on one thread everywhere: train() passes --threads 1).
        alone, r = self.resume("one", 1)
        check(self, r)
        self.assertEqual(resumed, alone, "TP 1 x PP 2 and one process resumed from it agree bit for bit")

    def test_the_run_file_is_the_same_however_its_path_is_spelled(self):
        # Written with an absolute path; resumed through a relative one with a detour.
        config = os.path.relpath(self.config, SOURCE_DIR).replace(os.sep, os.sep + "." + os.sep, 1)
        resumed, r = self.resume("spelled", 4, *self.TP2_DP2, config=config)
        check(self, r)
        self.assertEqual(resumed, self.full)

    def test_a_copy_of_the_run_file_elsewhere_continues_the_run(self):
        # The checkpoint records what the run's steps depend on, not where its file was.
        d = self.tmp.name
        os.makedirs(d + "/moved", exist_ok=True)
        copy = shutil.copy(self.config, d + "/moved/renamed.yaml")
        resumed, r = self.resume("moved", 4, *self.TP2_DP2, config=copy)
        check(self, r)
        self.assertNotIn("resharding", r.stderr)
        self.assertEqual(resumed, self.full)

    def test_a_checkpoint_of_another_seed_or_data_is_refused_naming_the_field(self):
        _, r = self.resume("seed", 2, "--strategy", "megatron", "--pp", "2", seed=5)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("was trained on another run: its seed was 1, this run's 5;", r.stderr)
        # The same path, its data edited since the checkpoint.
        d = self.tmp.name
        with open(self.config) as f:
            text = f.read()
        assert text.count("median: 24") == 1
        edited = os.path.join(d, "edited.yaml")
        with open(edited, "w") as f:
            f.write(text.replace("median: 24", "median: 20"))
        _, r = self.resume("edited", 4, *self.TP2_DP2, config=edited)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("was trained on another run: its data.image.median was 24, this run's 20; resume with "
                      "the run file it was trained with", r.stderr)
        self.assertEqual(sorted(os.listdir(d + "/ckpt-edited")), sorted(os.listdir(d + "/ckpt-seed")))
        self.assertEqual(losses(d + "/edited.jsonl"), self.full, "the metrics file is left as it was")

# The llm of 4 layers in 2 stages of 2 model chunks each (interleaved 1F1B's plan).
PP2_VIRTUAL_2 = """strategy: megatron
layout: monolithic
devices: 2
schedule: 1f1b
virtual_stages: 2
modules:
  - {name: vision, role: encoder, tp: 1, pp: 1, dp: 1, first_device: 0, devices: 1, first_stage: 0,
     microbatch_size: 4, layers_per_stage: [2]}
  - {name: projector, role: projector, tp: 1, pp: 1, dp: 1, first_device: 0, devices: 1, first_stage: 0,
     microbatch_size: 4, layers_per_stage: [2]}
  - {name: llm, role: llm, tp: 1, pp: 2, dp: 1, first_device: 0, devices: 2, first_stage: 0,
     microbatch_size: 4, layers_per_stage: [2, 2]}
"""


class Cli(unittest.TestCase):
    def test_seed_gives_other_weights_and_data_the_same_on_any_world(self):
        with tempfile.TemporaryDirectory() as d:
            for ranks, seed in [(1, None), (1, 7), (2, 7)]:
                extra = ["--seed", str(seed)] if seed is not None else []
                check(self, train(ranks, "--config", CLIP, "--steps", "2", "--quiet", "--metrics",
                                  f"{d}/{ranks}-{seed}.jsonl", *extra))
            default, one, two = (losses(f"{d}/{name}.jsonl") for name in ["1-None", "1-7", "2-7"])
            self.assertNotEqual(default[0], one[0])
            for a, b in zip(two, one):
                self.assertLessEqual(abs(a - b) / abs(b), TOLERANCE)

    def test_an_output_never_writes_over_an_input_or_the_other_output(self):
        with tempfile.TemporaryDirectory() as d:
            run = variant(d, CLIP, "run.yaml")
            with open(run) as f:
                before = f.read()
            for args, message in [(["--metrics", run], f"--metrics '{run}' is the file of --config"),
                                  (["--trace", d + "/./run.yaml"], "is the file of --config"),
                                  (["--metrics", d + "/out", "--trace", d + "/out"],
                                   "--metrics and --trace name one file"),
                                  (["--progress-every", "1", "--quiet"], "contradict each other"),
                                  # '' was taken as left out: a run without the output asked for.
                                  (["--metrics", ""], "--metrics names no file"),
                                  (["--trace", ""], "--trace names no file"),
                                  (["--checkpoint-dir", ""], "--checkpoint-dir names no file")]:
                with self.subTest(args=args):
                    r = train(1, "--config", run, "--steps", "1", *args)
                    self.assertEqual(r.returncode, 2, r.stderr)
                    self.assertIn(message, r.stderr)
            with open(run) as f:
                self.assertEqual(f.read(), before, "the run file is as it was")

    def test_ranks_started_with_other_commands_or_files_stop_at_once(self):
        # Unchecked, other --steps hung at the last common step, other seeds trained apart.
        base = [CLI, "train", "--threads", "1", "--quiet", "--config"]
        for first, second, message in [
                (["--steps", "3"], ["--steps", "5"], "rank 1 was started with another command than rank 0: "
                                                     "'--steps 5' there, '--steps 3' on rank 0 (argument 7)"),
                (["--steps", "2", "--seed", "1"], ["--steps", "2", "--seed", "7"], "'--seed 7' there, '--seed 1' on rank 0")]:
            with self.subTest(second=second):
                r = subprocess.run([*MPIEXEC, "-n", "1", *base, CLIP, *first, ":", "-n", "1", *base, CLIP, *second],
                                   cwd=SOURCE_DIR, capture_output=True, text=True, timeout=120)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn(message, r.stderr)
                self.assertEqual(r.stderr.count("braid: error:"), 1, r.stderr)  # said once, by rank 0
        with tempfile.TemporaryDirectory() as d:  # one path, other contents: as on two nodes' disks
            for name, steps in [("a", 10), ("b", 20)]:
                os.mkdir(f"{d}/{name}")
                variant(f"{d}/{name}", CLIP, "run.yaml", steps=steps)
            args = [*base, "run.yaml", "--steps", "2"]
            r = subprocess.run([*MPIEXEC, "-n", "1", "-wdir", f"{d}/a", *args, ":", "-n", "1", "-wdir", f"{d}/b",
                                *args], capture_output=True, text=True, timeout=120)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn("rank 1 reads other contents than rank 0 from the files the command names", r.stderr)

    def test_a_setup_error_is_said_once_and_ends_every_rank(self):
        # Every rank plans alike, so every rank printed the same error (one line per rank).
        r = train(3, "--config", CLIP, "--strategy", "distmm", "--steps", "1")
        self.assertEqual(r.returncode, 3, r.stderr)
        self.assertIn("no combination of the encoders' grids that fit memory uses all 3 devices", r.stderr)
        self.assertEqual(r.stderr.count("braid: error:"), 1, r.stderr)
        self.assertNotIn("MPI_ABORT", r.stderr)

    def test_trainer_section_errors_name_the_line_and_field(self):
        with tempfile.TemporaryDirectory() as d:
            config = variant(d, MLLM, "bad.yaml", steps=0)
            r = train(1, "--config", config)
            self.assertEqual(r.returncode, 2)
            self.assertRegex(r.stderr, r"bad\.yaml:\d+:\d+: trainer\.steps: must be at least 1 \(got 0\)")
            config = variant(d, MLLM, "typo.yaml", learnin_rate=0.1)
            r = train(1, "--config", config)
            self.assertEqual(r.returncode, 2)
            self.assertIn("did you mean 'learning_rate'?", r.stderr)

    def test_colocated_encoder_zero_above_1_is_refused(self):
        with tempfile.TemporaryDirectory() as d:
            config = variant(d, MLLM, "zero2.yaml", training={"zero_stage": 2})
            r = train(2, "--config", config, "--steps", "1", "--strategy", "optimus", "--pp", "2")
            self.assertEqual(r.returncode, 2)
            self.assertIn("the CPU trainer runs a colocated encoder's ZeRO at stage 1 only: 'vision' is data parallel "
                          "over ranks of different pipeline stages", r.stderr)
            self.assertEqual(r.stderr.count("braid: error:"), 1, r.stderr)
            self.assertNotIn("MPI_ABORT", r.stderr)

    def test_text_tables_too_small_for_the_captions_are_refused_at_set_up(self):
        # They failed inside an op of the first step that drew a long caption, naming no file.
        cases = [(MLLM, "tiny-mllm.yaml", "    vocab: 32", "    vocab: 24",
                  "module 'llm' has vocab 24; braid train's captions use 28 token ids"),
                 (MLLM, "tiny-mllm.yaml", "    max_positions: 32", "    max_positions: 20",
                  "module 'llm' has max_positions 20; braid train's sequences run to 28 (16 tokens of a 32 px "
                  "image, 12 of a caption)"),
                 (CLIP, "tiny-clip.yaml", "    max_positions: 16", "    max_positions: 10",
                  "module 'text_encoder' has max_positions 10; braid train's captions run to 12 tokens")]
        for base, model_file, line, bad, message in cases:
            with self.subTest(bad=bad), tempfile.TemporaryDirectory() as d:
                with open(os.path.join(SOURCE_DIR, "configs/models", model_file)) as f:
                    model = f.read()
                assert model.count(line) == 1, f"{model_file} changed"
                with open(f"{d}/model.yaml", "w") as f:
                    f.write(model.replace(line, bad))
                run = variant(d, base, "run.yaml")
                with open(run) as f:
                    text = f.read()
                with open(run, "w") as f:
                    f.write(re.sub(r"model: .*", f"model: {d}/model.yaml", text, count=1))
                r = train(2, "--config", run, "--steps", "1")
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn(f"({d}/model.yaml): {message}", r.stderr)
                self.assertEqual(r.stderr.count("braid: error:"), 1, r.stderr)
                self.assertNotIn("MPI_ABORT", r.stderr)

    def test_progress_eval_and_summary_lines(self):
        r = train(1, "--config", MLLM, "--steps", "2")
        check(self, r)
        self.assertRegex(r.stdout, r"step 1/2  loss \d+\.\d{4}  [\d.]+ samples/s  ETA \d+:\d\d:\d\d")
        self.assertRegex(r.stdout, r"eval at step 2: caption_loss [\d.]+ token_accuracy [\d.]+")
        self.assertIn("trained steps 1-2 of 2", r.stdout)

    def test_data_workers_train_the_same(self):
        with tempfile.TemporaryDirectory() as d:
            for workers in ["0", "2"]:
                check(self, train(2, "--config", CLIP, "--steps", "3", "--quiet", "--data-workers", workers,
                                  "--metrics", f"{d}/{workers}.jsonl"))
            self.assertEqual(losses(d + "/0.jsonl"), losses(d + "/2.jsonl"))
        for workers, message in [("-1", "must be >= 0 (got -1)"), ("100000", "at most 1024 (got 100000)")]:
            refused(self, ["train", "--config", CLIP, "--data-workers", workers], "--data-workers " + message)
        refused(self, ["train", "--config", CLIP, "--threads", "5000"], "--threads at most 1024 (got 5000)")

    def test_samples_are_priced_where_they_are_made_in_the_step(self):
        # cpu-host.yaml with the rates `braid calibrate` writes, on hosts of 64 cores (a core is
        # left for the workers) or 2 (two processes of one thread hold them both).
        with open(os.path.join(SOURCE_DIR, "configs/clusters/cpu-host.yaml")) as f:
            base = f.read()
        rates = "data: {render_sample_us: 3, render_pixel_ns: 5, describe_sample_us: 1}\n"
        with tempfile.TemporaryDirectory() as d:
            summaries = {}
            for cores, workers in [(64, "1"), (64, "0"), (2, "1")]:
                cluster = f"{d}/cluster-{cores}.yaml"
                with open(cluster, "w") as f:
                    f.write(base + rates + f"shared_cores: {{cores_per_node: {cores}, threads_per_device: 1}}\n")
                r = train(2, "--config", CLIP, "--steps", "3", "--quiet", "--cluster", cluster,
                          "--data-workers", workers, "--metrics", f"{d}/{cores}-{workers}.jsonl")
                check(self, r)
                self.assertRegex(r.stdout, r"\ntaking samples per rank and step, measured [\d.]+ [mu]?s, "
                                           r"simulated [\d.]+ [mu]?s\n")
                summaries[cores, workers] = [m for m in metrics(f"{d}/{cores}-{workers}.jsonl") if m.get("summary")][0]
            # A worker with a core of its own: free. Made in the step (no worker, or no core for
            # it): each rank renders its 64 images of 16-32 px and describes 64 (data parallel,
            # both towers), at least 64 x (3 us + 256 x 5 ns) + 64 x 1 us.
            self.assertEqual(summaries[64, "1"]["simulated_data_s"], 0)
            floor = 64 * (3e-6 + 256 * 5e-9) + 64 * 1e-6
            for key in [(64, "0"), (2, "1")]:
                self.assertGreaterEqual(summaries[key]["simulated_data_s"], floor)
                self.assertGreater(summaries[key]["simulated_step_s"], summaries[64, "1"]["simulated_step_s"])

    def test_profile_ops_times_every_op_against_its_price_without_changing_the_run(self):
        with tempfile.TemporaryDirectory() as d:
            runs = {}
            for name, extra in [("plain", []), ("profiled", ["--profile-ops"])]:
                r = train(2, "--config", MLLM, "--pp", "2", "--steps", "3", "--quiet", "--metrics",
                          f"{d}/{name}.jsonl", *extra)
                check(self, r)
                runs[name] = r
            self.assertEqual(losses(f"{d}/plain.jsonl"), losses(f"{d}/profiled.jsonl"))
            self.assertNotIn("ops per rank and step", runs["plain"].stdout)
            out = runs["profiled"].stdout
            self.assertIn("ops per rank and step (mean of 2 steps and 2 ranks), measured and as the cost model "
                          "prices the same calls:\n", out)
            self.assertRegex(out, r"\nlinear_forward +[\d.]+ +[\d.]+ [mu]?s +[\d.]+ [mu]?s +\d+\.\d\d\n")
            self.assertRegex(out, r"\npriced ops: measured [\d.]+ [mu]?s, priced [\d.]+ [mu]?s: measured/priced "
                                  r"[\d.]+; all ops [\d.]+ [mu]?s of the instructions' measured compute [\d.]+ [mu]?s")
            profile = [m for m in metrics(f"{d}/profiled.jsonl") if m.get("op_profile")]
            self.assertEqual(len(profile), 1)
            self.assertEqual((profile[0]["steps"], profile[0]["ranks"]), (2, 2))
            ops = {o["op"]: o for o in profile[0]["ops"]}
            # The llm's stages: GEMMs, norms, attention, the loss, the optimizer; all priced.
            for op in ("linear_forward", "linear_backward", "layernorm_forward", "attention_backward",
                       "cross_entropy", "adamw_step"):
                self.assertGreater(ops[op]["calls"], 0, op)
                self.assertGreater(ops[op]["measured_s"], 0, op)
                self.assertGreater(ops[op]["priced_s"], 0, op)
            self.assertNotIn("contrastive_loss", ops)
            # CLIP on one process: its loss runs, and the model has no price for it.
            r = train(1, "--config", CLIP, "--steps", "2", "--quiet", "--profile-ops")
            check(self, r)
            self.assertRegex(r.stdout, r"\ncontrastive_loss +1\.0 +[\d.]+ [mu]?s +[\d.]+ [mu]?s +[\d.]+\n")
            self.assertRegex(r.stdout, r"\ncopy to host +[\d.]+ +[\d.]+ [mu]?s +- +-\n")
            # On a device the profile waits for the stream after each op: its own waits, not
            # the step's, so the host waits per step read as without it.
            waits = {}
            for name, extra in [("emulated", []), ("emulated-profiled", ["--profile-ops"])]:
                check(self, train(1, "--config", CLIP, "--steps", "3", "--quiet", "--device", "emulated",
                                  "--metrics", f"{d}/{name}.jsonl", *extra))
                waits[name] = [m for m in metrics(f"{d}/{name}.jsonl") if m.get("summary")][0]["host_waits_per_step"]
            self.assertGreater(waits["emulated"], 0)
            self.assertEqual(waits["emulated"], waits["emulated-profiled"])

    def test_the_simulated_compute_is_what_the_ops_the_ranks_ran_are_priced(self):
        """One source: the program's durations price braid's own modules (cost::Kernels::reference),
        so the compute the simulator gives a step is what --profile-ops prices that step's op calls
        at, call by call. Every image at the nominal side and no clipping (a pass only when the norm
        is over, which the program does not price); the captions vary, priced as the ranks padded
        them (cost::TrainedSamples). 0.7-1.2% apart on this machine; 8.5% with Megatron's kernels."""
        with tempfile.TemporaryDirectory() as d:
            for base, ranks, extra in [(CLIP, 1, []), (MLLM, 2, ["--pp", "2"])]:
                path = variant(d, base, "fixed.yaml", grad_clip=0)
                with open(path) as f:
                    text = re.sub(r"\n +distribution: .*", "", f.read())
                with open(path, "w") as f:
                    f.write(text)
                m = os.path.join(d, os.path.basename(base) + ".jsonl")
                check(self, train(ranks, "--config", path, "--steps", "3", "--quiet", "--profile-ops", "--metrics", m,
                                  *extra))
                summary = [x for x in metrics(m) if x.get("summary")][0]
                profile = [x for x in metrics(m) if x.get("op_profile")][0]
                simulated = sum(summary["simulated_compute_s"].values())
                priced = sum(o.get("priced_s", 0.0) for o in profile["ops"])
                self.assertAlmostEqual(priced / simulated, 1.0, delta=0.025, msg=base)

    def test_schedule_must_be_one_the_plan_runs(self):
        r = train(1, "--config", MLLM, "--steps", "1", "--schedule", "two-phase")
        self.assertEqual(r.returncode, 2)
        self.assertIn("--schedule: a monolithic plan of this model runs 1f1b or gpipe, not 'two-phase'", r.stderr)

    def test_waits_inside_an_instruction_are_not_its_compute(self):
        # Tensor parallelism's collectives run and wait inside forwards and backwards (as ZeRO's
        # do after the optimizer step); those waits are idle time, not the instructions' compute,
        # so a rank's compute and idle add up to no more than its step.
        with tempfile.TemporaryDirectory() as d:
            r = train(2, "--config", MLLM, "--steps", "8", "--strategy", "megatron", "--tp", "2", "--metrics",
                      d + "/m.jsonl")
            check(self, r)
            s = [m for m in metrics(d + "/m.jsonl") if m.get("summary")][-1]
            self.assertGreater(s["measured_idle_s"]["tp"], 0)
            self.assertLessEqual(sum(s["measured_compute_s"].values()) + sum(s["measured_idle_s"].values()),
                                 s["measured_step_s"])
            # The simulator counts them alike: its compute and idle add up to its step.
            self.assertGreater(s["simulated_idle_s"]["tp"], 0)
            self.assertLessEqual(sum(s["simulated_compute_s"].values()) + sum(s["simulated_idle_s"].values()),
                                 s["simulated_step_s"] * (1 + 1e-9))

    def test_measured_step_next_to_the_simulated_one_and_a_trace_like_simulate(self):
        with tempfile.TemporaryDirectory() as d:
            r = train(2, "--config", MLLM, "--steps", "3", "--strategy", "optimus", "--pp", "2", "--schedule",
                      "optimus-online", "--metrics", d + "/m.jsonl", "--trace", d + "/train.json")
            check(self, r)
            self.assertRegex(r.stdout, r"measured step [\d.]+ m?s \(mean of 2 steps, slowest rank\), simulated [\d.]+ m?s "
                                       r"for the same program \(optimus-online\): measured/simulated [\d.]+")
            # Replayed on the images the two steps trained, next to the program as priced.
            self.assertRegex(r.stdout, r"\nsimulated step replayed on the images of 2 of those steps, microbatch by microbatch; "
                                       r"[\d.]+ m?s with every microbatch at their mean\n")
            self.assertRegex(r.stdout, r"idle per rank and step, measured   .*pp_")
            # Compute by kind, measured and simulated, in the same words.
            for side in ("measured  ", "simulated "):
                self.assertRegex(r.stdout, rf"\ncompute per rank and step, {side} forward [\d.]+ [mu]?s, backward [\d.]+ [mu]?s, "
                                           r"other [\d.]+ [mu]?s\n")
            summary = [m for m in metrics(d + "/m.jsonl") if m.get("summary")]
            self.assertEqual(len(summary), 1)
            s = summary[0]
            self.assertEqual(s["step"], 3)
            self.assertEqual(s["schedule"], "optimus-online")
            printed = re.search(r"measured/simulated ([\d.]+)", r.stdout).group(1)
            self.assertEqual(printed, f"{s['measured_over_simulated']:.2f}")
            self.assertGreater(s["measured_step_s"], 0)
            self.assertGreater(s["simulated_step_s"], 0)
            self.assertGreater(s["priced_step_s"], 0)
            self.assertEqual(s["replayed_steps"], 2)
            for side in ("measured_compute_s", "simulated_compute_s"):
                self.assertEqual(list(s[side]), ["forward", "backward", "other"])
                # Every rank runs forwards and backwards, and a training backward outweighs its forward.
                self.assertGreater(s[side]["forward"], 0)
                self.assertGreater(s[side]["backward"], s[side]["forward"] * 0.5)
            # A rank computes within its step: the slowest rank's mean step bounds the mean rank's compute.
            self.assertLessEqual(sum(s["measured_compute_s"].values()), s["measured_step_s"])
            # The simulated side, both from the replayed steps.
            self.assertLessEqual(sum(s["simulated_compute_s"].values()), s["simulated_step_s"] * (1 + 1e-9))
            self.assertGreaterEqual(s["measured_data_s"], 0)
            self.assertGreaterEqual(s["simulated_data_s"], 0)
            # Two llm stages: some rank waits on its neighbour, and the waits are classified.
            self.assertGreater(sum(v for k, v in s["measured_idle_s"].items() if k.startswith("pp_")), 0)
            # The measured trace is laid out as braid simulate's: the same metadata, events and arguments.
            sim = subprocess.run([CLI, "simulate", "--config", MLLM, "--strategy", "optimus", "--pp", "2", "--schedule",
                                  "optimus-online", "--trace", d + "/sim.json"], cwd=SOURCE_DIR, capture_output=True,
                                 text=True)
            check(self, sim)
            with open(d + "/train.json") as f:
                measured = json.load(f)
            with open(d + "/sim.json") as f:
                simulated = json.load(f)
            self.assertEqual(measured["otherData"]["generator"], "braid train")
            self.assertEqual(set(measured["otherData"]), set(simulated["otherData"]))
            kinds = lambda doc: {(e["ph"], e.get("name") if e["ph"] == "M" else e.get("cat")) for e in doc["traceEvents"]}
            self.assertLessEqual(kinds(simulated), kinds(measured))
            # The idle share of the ranks' step, as the simulator counts it (it was always 0).
            idle = measured["otherData"]["bubble_fraction"]
            busy = sum(e["dur"] for e in measured["traceEvents"] if e["ph"] == "X" and e["tid"] == 0)
            self.assertGreater(idle, 0)
            self.assertAlmostEqual(idle, 1 - busy / (2 * 1e6 * measured["otherData"]["step_time_s"]), places=6)
            per_rank = executed(d + "/train.json")
            self.assertEqual(sorted(per_rank), [0, 1])
            for count, events in per_rank.values():
                self.assertEqual(len(events), count)
                self.assertLessEqual({"op", "index"}, set(events[0]["args"]))

    def test_a_plan_of_virtual_stages_runs_1f1b(self):
        # Its default was the interleaved program, whose model chunks the trainer's stages do not
        # run: the first message failed. Now 1F1B runs it, as one process does.
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(SOURCE_DIR, "configs/models/tiny-mllm.yaml")) as f:
                model = f.read()
            llm = "    inputs: [projector]\n    layers: 2\n"
            assert model.count(llm) == 1, "tiny-mllm's llm changed"
            with open(f"{d}/model.yaml", "w") as f:
                f.write(model.replace(llm, "    inputs: [projector]\n    layers: 4\n"))
            run = variant(d, MLLM, "run.yaml")
            with open(run) as f:
                text = f.read()
            with open(run, "w") as f:
                f.write(re.sub(r"model: .*", f"model: {d}/model.yaml", text, count=1))
            with open(f"{d}/plan.yaml", "w") as f:
                f.write(PP2_VIRTUAL_2)
            r = train(2, "--config", run, "--plan", f"{d}/plan.yaml", "--steps", "2", "--metrics", f"{d}/two.jsonl")
            check(self, r)
            self.assertIn("schedule 1f1b", r.stdout)
            check(self, train(1, "--config", run, "--steps", "2", "--quiet", "--metrics", f"{d}/one.jsonl"))
            for a, b in zip(losses(f"{d}/two.jsonl"), losses(f"{d}/one.jsonl")):
                self.assertLessEqual(abs(a - b) / abs(b), TOLERANCE)
            r = train(2, "--config", run, "--plan", f"{d}/plan.yaml", "--steps", "1", "--schedule", "interleaved")
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn("--schedule: braid train runs one model chunk per pipeline stage, not 'interleaved'", r.stderr)
            # A plan of another world is said once, every rank stopping alike (each rank said it,
            # then MPI_ABORT).
            r = train(4, "--config", run, "--plan", f"{d}/plan.yaml", "--steps", "1", "--quiet")
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertEqual(r.stderr.count("the plan runs on 2 devices but the world has 4 ranks"), 1, r.stderr)
            self.assertNotIn("MPI_ABORT", r.stderr)

    def test_progress_lines_every_n_steps(self):
        # Not a terminal: a line for the first step, every multiple of N, and the last.
        r = train(1, "--config", MLLM, "--steps", "5", "--progress-every", "2")
        check(self, r)
        printed = [int(m) for m in re.findall(r"^step (\d+)/5 ", r.stdout, re.M)]
        self.assertEqual(printed, [1, 2, 4, 5])
        self.assertNotIn("\r", r.stdout)
        r = train(1, "--config", MLLM, "--steps", "1", "--progress-every", "0")
        self.assertEqual(r.returncode, 2)
        self.assertIn("--progress-every must be >= 1", r.stderr)

    def test_one_live_progress_line_on_a_terminal(self):
        # On a terminal each step rewrites the line in place (carriage return, clear to the
        # end); the evaluation and the summary start on lines of their own below it.
        leader, follower = pty.openpty()
        proc = subprocess.Popen([CLI, "train", "--threads", "1", "--config", MLLM, "--steps", "3"], cwd=SOURCE_DIR,
                                stdout=follower, stderr=subprocess.DEVNULL)
        os.close(follower)
        out = b""
        deadline = time.time() + 120
        while time.time() < deadline:
            if not select.select([leader], [], [], 1)[0]:
                continue
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
        os.close(leader)
        self.assertEqual(proc.wait(timeout=120), 0)
        text = out.decode().replace("\r\n", "\n")
        self.assertEqual(text.count("\r\033[K"), 3, text)
        self.assertRegex(text, r"\r\033\[Kstep 3/3  loss [\d.]+ [^\n]*\neval at step 3: ")


def cuda_devices():
    """The GPUs `braid info` sees through the CUDA plugin (none without one, or without CUDA)."""
    r = subprocess.run([CLI, "info", "--format", "json"], capture_output=True, text=True, timeout=120)
    info = json.loads(r.stdout)
    return [d for p in info["plugins"] if p["name"] == "cuda" for d in p.get("devices", [])]


class Device(unittest.TestCase):
    """`--device host` runs every op through the device interface (libbraid-host.so behind
    nn::DeviceOps): the path a GPU backend takes, on host memory; `--device host-staged`
    the same behind StagedOps, copying every op's inputs in and outputs out as on a GPU;
    `--device emulated` keeps every tensor in the backend's memory as a device's (what
    cuda does), crossing to the host only to send, reduce, checkpoint and evaluate. All run
    the same host ops, so every step's loss must be the same bits as the default's, resumed
    runs included. `--device cuda` runs on a GPU where there is one (within 1e-4 of the host,
    the same bits run twice and resumed halfway, two and four processes sharing it);
    without one it must say so."""

    def assert_same_bits(self, config, ranks, *args):
        with tempfile.TemporaryDirectory() as d:
            runs = {}
            for device in ["auto", "host", "host-staged", "emulated"]:
                r = train(ranks, "--config", config, "--steps", "4", "--device", device, "--metrics",
                          f"{d}/{device}.jsonl", *args)
                check(self, r)
                runs[device] = r.stdout
            self.assertEqual(losses(d + "/auto.jsonl"), losses(d + "/host.jsonl"))
            self.assertEqual(losses(d + "/auto.jsonl"), losses(d + "/host-staged.jsonl"))
            self.assertEqual(losses(d + "/auto.jsonl"), losses(d + "/emulated.jsonl"))
            evals = {dev: [m for m in metrics(f"{d}/{dev}.jsonl") if m.get("eval")] for dev in runs}
            self.assertTrue(evals["auto"])
            self.assertEqual(evals["auto"], evals["emulated"])  # the whole model on the device, once
            self.assertRegex(runs["emulated"], r"device: host backend .*, emulated:0, tensors resident")
            # How often a step waited for the device (a GPU pays a round trip each time):
            # printed and in the summary's JSON on a device, absent without one.
            waits = float(re.search(r"host waits for the device per step ([\d.]+) \(the most of any rank\)",
                                    runs["emulated"]).group(1))
            summary = {dev: [m for m in metrics(f"{d}/{dev}.jsonl") if m.get("summary")][-1] for dev in runs}
            self.assertAlmostEqual(summary["emulated"]["host_waits_per_step"], waits, delta=0.05)
            self.assertGreater(waits, 0)
            self.assertNotIn("host_waits_per_step", summary["auto"])
            self.assertNotIn("host waits", runs["auto"])
            self.assertIn("device: host backend", runs["host"])
            self.assertRegex(runs["host-staged"], r"device: host backend .*, staged")
            self.assertRegex(runs["host"], r"device memory \(host backend\): peak [\d.]+ MiB in use, "
                                           r"[\d.]+ MiB reserved, \d+ allocations")
            self.assertNotIn("device:", runs["auto"])
            # What the pool caches is not counted as activations: both measure the same.
            measured = {dev: [m for m in metrics(f"{d}/{dev}.jsonl") if m.get("memory")][-1] for dev in runs}
            for dev in ["host", "emulated"]:
                for rank_auto, rank_dev in zip(measured["auto"]["ranks"], measured[dev]["ranks"]):
                    a, h = rank_auto["measured_bytes"]["activations"], rank_dev["measured_bytes"]["activations"]
                    self.assertLess(abs(h - a), 0.25 * a + (2 << 20), (dev, a, h))
            return runs

    def test_clip_on_one_process(self):
        self.assert_same_bits(CLIP, 1)

    def test_mllm_pipeline_on_two_processes(self):
        self.assert_same_bits(MLLM, 2, "--strategy", "disttrain")

    def test_optimus_on_two_processes(self):
        self.assert_same_bits(MLLM, 2, "--strategy", "optimus", "--schedule", "optimus-online")

    def test_distmm_on_two_processes(self):
        self.assert_same_bits(CLIP, 2, "--strategy", "distmm", "--schedule", "distmm-pipe")

    def test_data_parallel_gradients_reduce_on_the_device(self):
        # The emulated device all-reduces its DP groups' gradients through the MPI plugin's
        # communication interface v2, on the device's memory, as cuda does through NCCL.
        runs = self.assert_same_bits(MLLM, 4, "--strategy", "megatron", "--dp", "4")
        self.assertIn("device collectives: mpi (", runs["emulated"])
        self.assertIn("device collectives: none (the tensors are host memory)", runs["host"])

    def test_collectives_staged_through_the_host(self):
        # BRAID_DEVICE_COLLECTIVES=host stages every collective through host memory and MPI,
        # as processes sharing a GPU do (NCCL refuses them): the same bits, and each module's
        # laid-out gradients cross to the host and back once (a wait each), not a gradient at
        # a time (about 260 waits a step here).
        with tempfile.TemporaryDirectory() as d:
            env = dict(os.environ, BRAID_DEVICE_COLLECTIVES="host")
            args = ["--config", MLLM, "--steps", "4", "--strategy", "megatron", "--dp", "2"]
            device = train(2, *args, "--device", "emulated", "--metrics", f"{d}/device.jsonl")
            check(self, device)
            staged = train(2, *args, "--device", "emulated", "--metrics", f"{d}/staged.jsonl", env=env)
            check(self, staged)
            self.assertIn("device collectives: none (BRAID_DEVICE_COLLECTIVES=host)", staged.stdout)
            self.assertEqual(losses(f"{d}/staged.jsonl"), losses(f"{d}/device.jsonl"))
            waits = {name: [m for m in metrics(f"{d}/{name}.jsonl") if m.get("summary")][-1]["host_waits_per_step"]
                     for name in ("device", "staged")}
            modules = 3  # vision, projector, llm: one download each
            self.assertLessEqual(waits["staged"], waits["device"] + modules, waits)
            bogus = train(1, "--config", MLLM, "--steps", "1", "--device", "emulated",
                          env=dict(os.environ, BRAID_DEVICE_COLLECTIVES="nccl-please"))
            self.assertEqual(bogus.returncode, 2, bogus.stdout + bogus.stderr)
            self.assertIn("BRAID_DEVICE_COLLECTIVES must be auto or host, got 'nccl-please'", bogus.stderr)

    def test_optimus_data_parallel_reduces_on_the_device(self):
        # Colocated replicas post the llm's gradient all-reduce on the device at the first
        # encoder backward in the DP wait (the bubble scheduler's flag) and finish it at
        # ReduceGrads, as the host path does over MPI: the same bits either way (that the post
        # does not block is mpi.comm_v2's "posted" check).
        runs = self.assert_same_bits(MLLM, 2, "--strategy", "optimus", "--dp", "2", "--schedule", "optimus-fine")
        self.assertIn("device collectives: mpi (", runs["emulated"])

    def test_zero_stages_on_the_device(self):
        with tempfile.TemporaryDirectory() as d:
            for stage in [1, 2, 3]:
                config = variant(d, MLLM, f"zero{stage}.yaml", training={"zero_stage": stage})
                self.assert_same_bits(config, 2, "--strategy", "megatron", "--dp", "2")

    def test_recomputation_on_the_device(self):
        # Full recomputation through the device interface: a block's forward run again from a
        # view of its kept input, and a colocated encoder's layer recomputed in its first
        # backward task, on the device's memory: the default's losses, bit for bit.
        with tempfile.TemporaryDirectory() as d:
            config = variant(d, MLLM, "mllm-recompute-full.yaml", training={"recompute": "full"})
            self.assert_same_bits(config, 1)
            self.assert_same_bits(config, 2, "--strategy", "optimus", "--schedule", "optimus-fine")

    def test_emulated_resumes_to_the_same_bits(self):
        with tempfile.TemporaryDirectory() as d:
            args = ["--config", MLLM, "--strategy", "disttrain", "--quiet"]
            check(self, train(2, *args, "--steps", "4", "--metrics", f"{d}/whole.jsonl"))
            check(self, train(2, *args, "--steps", "2", "--device", "emulated", "--checkpoint-dir", f"{d}/ck",
                              "--metrics", f"{d}/first.jsonl"))
            check(self, train(2, *args, "--steps", "4", "--device", "emulated", "--checkpoint-dir", f"{d}/ck",
                              "--resume", "--metrics", f"{d}/rest.jsonl"))
            self.assertEqual(losses(f"{d}/first.jsonl") + losses(f"{d}/rest.jsonl"), losses(f"{d}/whole.jsonl"))

    def test_a_zero3_checkpoint_of_the_device_resumes_on_the_host(self):
        with tempfile.TemporaryDirectory() as d:
            config = variant(d, MLLM, "zero3.yaml", training={"zero_stage": 3})
            args = ["--config", config, "--strategy", "megatron", "--dp", "2", "--quiet"]
            check(self, train(2, *args, "--steps", "4", "--metrics", f"{d}/whole.jsonl"))
            check(self, train(2, *args, "--steps", "2", "--device", "emulated", "--checkpoint-dir", f"{d}/ck",
                              "--metrics", f"{d}/first.jsonl"))
            check(self, train(2, *args, "--steps", "4", "--checkpoint-dir", f"{d}/ck", "--resume", "--metrics",
                              f"{d}/rest.jsonl"))
            self.assertEqual(losses(f"{d}/first.jsonl") + losses(f"{d}/rest.jsonl"), losses(f"{d}/whole.jsonl"))

    def test_tensor_and_sequence_parallelism_on_the_device(self):
        with tempfile.TemporaryDirectory() as d:
            sp = variant(d, MLLM, "sp.yaml", training={"sequence_parallel": "true"})
            for config in [MLLM, sp]:
                self.assert_same_bits(config, 2, "--strategy", "megatron", "--tp", "2")
            self.assert_same_bits(CLIP, 2, "--strategy", "megatron", "--tp", "2")

    def test_cuda_matches_the_host_or_says_why_not(self):
        if not cuda_devices():
            r = train(2, "--config", CLIP, "--steps", "1", "--device", "cuda")
            self.assertNotEqual(r.returncode, 0, r.stdout)
            self.assertEqual(r.stderr.count("--device cuda: no GPU"), 1, r.stderr)  # said once, not per rank
            self.assertNotIn("MPI_ABORT", r.stderr)
            print("no GPU here: checked that --device cuda says so; the CUDA comparisons run on a GPU machine")
            return
        with tempfile.TemporaryDirectory() as d:
            for name, ranks, config, args in [("clip", 1, CLIP, []), ("mllm", 2, MLLM, ["--strategy", "disttrain"]),
                                              ("mllm-4", 4, MLLM, ["--strategy", "disttrain"])]:
                for device in ["auto", "cuda", "cuda-again"]:
                    check(self, train(ranks, "--config", config, "--steps", "20", "--device",
                                      device.replace("-again", ""), "--metrics", f"{d}/{name}-{device}.jsonl",
                                      *args))
                host, cuda = losses(f"{d}/{name}-auto.jsonl"), losses(f"{d}/{name}-cuda.jsonl")
                self.assertEqual(len(host), 20)
                for step, (a, b) in enumerate(zip(cuda, host), 1):
                    self.assertLessEqual(abs(a - b) / abs(b), TOLERANCE, f"{name} step {step}: cuda {a}, host {b}")
                self.assertEqual(cuda, losses(f"{d}/{name}-cuda-again.jsonl"), f"{name}: a rerun on the GPU")
                # Resumed halfway, on the GPU: the same bits as the whole run.
                ck = f"{d}/{name}-ck"
                for steps, extra in [("10", []), ("20", ["--resume"])]:
                    check(self, train(ranks, "--config", config, "--steps", steps, "--device", "cuda", "--checkpoint-dir",
                                      ck, "--metrics", f"{d}/{name}-resumed-{steps}.jsonl", *extra, *args))
                resumed = losses(f"{d}/{name}-resumed-10.jsonl") + losses(f"{d}/{name}-resumed-20.jsonl")
                self.assertEqual(resumed, cuda, f"{name}: resumed on the GPU")

    def test_unknown_devices_are_refused(self):
        r = train(1, "--config", CLIP, "--device", "gpu")
        self.assertEqual(r.returncode, 2)
        self.assertIn("--device must be auto, host, host-staged, emulated or cuda, got 'gpu'", r.stderr)


class Calibrate(unittest.TestCase):
    """braid calibrate under mpiexec writes a cluster file that plan, simulate and train read."""

    def calibrate(self, ranks, *args):
        cmd = [*MPIEXEC, "-n", str(ranks), CLI, "calibrate", "--quick", *args]
        return subprocess.run(cmd, cwd=SOURCE_DIR, capture_output=True, text=True, timeout=600)

    def test_writes_a_cluster_file_the_trainer_prices_its_program_on(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "here.yaml")
            r = self.calibrate(2, "--out", path, "--format", "json")
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            report = json.loads(r.stdout)
            self.assertEqual(report["processes"], 2)
            self.assertGreater(report["fitted"]["peak_flops"], 0)
            self.assertGreater(len(report["timings"]["gemm"]), 3)
            self.assertEqual({t["op"] for t in report["timings"]["intra_node"]}, {"p2p", "all-reduce", "all-gather"})
            with open(path) as f:
                text = f.read()
            # It says what was measured, when and on what.
            self.assertRegex(text, r"# Measured by `braid calibrate` on \S+ at \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")
            self.assertIn("2 process(es) on 1 host(s)", text)
            self.assertIn("devices_per_node: 2", text)
            probe = report["timings"]["probe"]
            self.assertGreater(probe["seconds"], 0)
            self.assertIn(f"probe: {{rows: {probe['rows']}, width: {probe['width']}, seconds: ", text)
            # A file whose probe took 10x as long: the host now runs it about a tenth of that.
            slow = os.path.join(d, "slow.yaml")
            with open(slow, "w") as f:
                f.write(re.sub(r"seconds: [\d.e-]+\}", f"seconds: {10 * probe['seconds']}}}", text))
            # The trainer's simulated step moves with the cluster it is priced on.
            steps, summaries = {}, {}
            for name, extra in [("nominal", []), ("calibrated", ["--cluster", path]), ("slow", ["--cluster", slow])]:
                metrics = os.path.join(d, name + ".jsonl")
                r = train(2, "--config", CLIP, "--steps", "2", "--metrics", metrics, *extra)
                check(self, r)
                with open(metrics) as f:
                    summaries[name] = [json.loads(line) for line in f if '"summary"' in line][-1]
                steps[name] = summaries[name]["simulated_step_s"]
                # The host probe: only where the file has one (a calibrated file).
                if name == "nominal":
                    self.assertNotIn("probe_before", summaries[name])
                    self.assertNotIn("host speed probe", r.stdout)
                else:
                    self.assertRegex(r.stdout, r"\nhost speed probe \(the cluster file's GEMM case\), now/calibrated: "
                                               r"[\d.]+ before the steps, [\d.]+ after")
            self.assertNotAlmostEqual(steps["nominal"], steps["calibrated"], places=6)
            for when in ("probe_before", "probe_after"):
                self.assertGreater(summaries["calibrated"][when], 0)
                self.assertLess(summaries["slow"][when], 0.5)
            # plan and simulate take it too.
            r = subprocess.run([CLI, "simulate", "--config", CLIP, "--cluster", path, "--strategy", "megatron",
                                "--tp", "1", "--pp", "1", "--format", "json"], cwd=SOURCE_DIR, capture_output=True,
                               text=True, timeout=120)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_an_unwritable_place_is_refused_before_measuring_and_nothing_is_left(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "kept.yaml")
            with open(path, "w") as f:
                f.write("earlier\n")
            for out, why in [(os.path.join(d, "missing", "x.yaml"), "no directory"), (d, "it is a directory")]:
                r = self.calibrate(2, "--out", out, "--format", "json")
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertEqual(r.stderr.count("cannot write the cluster file"), 1, r.stderr)  # said once, by rank 0
                self.assertIn(f"cannot write the cluster file to '{out}': {why}", r.stderr)
                self.assertEqual(r.stdout, "")  # refused before measuring: no report
            with open(path) as f:
                self.assertEqual(f.read(), "earlier\n")
            self.assertEqual(os.listdir(d), ["kept.yaml"])

    def test_the_compute_cases_run_on_the_device_asked_for(self):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "host.yaml")
            r = self.calibrate(2, "--device", "host", "--out", out, "--quiet")
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(out) as f:
                text = f.read()
            self.assertIn("ops through the host backend (device interface 2)", text)
            self.assertIn("(float32, OpenBLAS)", text)
            out = os.path.join(d, "cuda.yaml")
            r = self.calibrate(2, "--device", "cuda", "--out", out, "--quiet")
            if cuda_devices():
                self.assertEqual(r.returncode, 0, r.stderr)
                with open(out) as f:
                    text = f.read()
                self.assertIn("(float32, cuBLAS)", text)
                self.assertIn("; links timed on ", text)  # NCCL with a GPU each, else host memory and why
            else:
                self.assertNotEqual(r.returncode, 0)
                self.assertEqual(r.stderr.count("--device cuda: no GPU"), 1, r.stderr)  # said once, not per rank
                self.assertNotIn("MPI_ABORT", r.stderr)
                self.assertFalse(os.path.exists(out))

    def test_on_a_device_the_links_are_timed_where_its_collectives_run(self):
        # The emulated device's collectives go through the MPI plugin's device interface (v2),
        # as NCCL's do on GPUs: the links are timed there, on the device's memory.
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "emulated.yaml")
            r = self.calibrate(2, "--device", "emulated", "--out", out, "--format", "json", "--quiet")
            self.assertEqual(r.returncode, 0, r.stderr)
            report = json.loads(r.stdout)
            self.assertIn("links timed on the device's memory through the mpi plugin's device interface",
                          report["communication"])
            timings = report["timings"]["intra_node"]
            self.assertEqual({t["op"] for t in timings}, {"p2p", "all-reduce", "all-gather"})
            self.assertTrue(all(t["seconds"] > 0 for t in timings), timings)
            with open(out) as f:
                text = f.read()
            self.assertIn("ops through the host backend as an emulated device", text)
            self.assertIn("links timed on the device's memory", text)
            out = os.path.join(d, "host.yaml")  # host memory: the world's communicators, no note
            r = self.calibrate(2, "--device", "host", "--out", out, "--quiet")
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(out) as f:
                self.assertNotIn("links timed", f.read())

    def test_a_name_with_yaml_syntax_reads_back(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "named.yaml")
            r = self.calibrate(2, "--out", path, "--name", 'lab: rack "7" # east', "--quiet")
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            r = subprocess.run([CLI, "plan", "--config", CLIP, "--cluster", path, "--strategy", "megatron", "--tp", "1",
                                "--pp", "1", "--format", "json"], cwd=SOURCE_DIR, capture_output=True, text=True,
                               timeout=120)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_one_process_and_bad_options_are_refused_with_the_reason(self):
        r = subprocess.run([CLI, "calibrate", "--quick"], cwd=SOURCE_DIR, capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 2)
        self.assertIn("one process measures no links: launch it with mpiexec -n 2", r.stderr)
        refused(self, ["calibrate", "--format", "yaml"], "--format must be table or json")
        # A thread count no host has is a typo: refused before anything starts that many.
        refused(self, ["calibrate", "--threads", "100000"], "--threads at most 1024 (got 100000)")
        refused(self, ["train", "--config", CLIP, "--cluster", "/nonexistent.yaml"], "/nonexistent.yaml")


class Memory(unittest.TestCase):
    """Each rank measures its peak bytes by kind; rank 0 prints them and writes them to the
    metrics file next to the cost model's prediction for the same plan and rank."""

    KINDS = {"weights", "gradients", "optimizer", "activations", "communication", "total"}
    MEASURED_ONLY = {"messages"}  # point-to-point sends in flight
    STATE = ("weights", "gradients", "optimizer")
    # tiny-mllm's parameters, counted by hand from its shapes (tests/unit/cost_test.cpp): the
    # whole model (vision 112,960 + projector 24,832 + llm 409,088), and what one rank of a
    # TP 2 group holds (63,360 + 12,480 + 207,488).
    MLLM_PARAMETERS = 546880
    LLM_PARAMETERS = 409088
    LLM_BLOCK = 198272
    MLLM_TP2_PARAMETERS = 283328

    def memory_line(self, path):
        lines = [m for m in metrics(path) if m.get("memory")]
        self.assertEqual(len(lines), 1)
        return lines[0]

    def train_memory(self, d, name, ranks, config, *args):
        """Trains 2 steps (AdamW's moments exist after the first); returns the memory line and stdout."""
        path = f"{d}/{name}.jsonl"
        r = train(ranks, "--config", config, "--steps", "2", "--data-workers", "0", "--metrics", path, *args)
        check(self, r)
        m = self.memory_line(path)
        self.assertEqual(m["step"], 2)
        self.assertEqual((m["run_precision"], m["predicted_as"]), ("fp32", "fp32"))
        self.assertEqual([x["rank"] for x in m["ranks"]], list(range(ranks)))
        self.assertNotIn("prediction_error", m)
        return m, r.stdout

    def test_measured_next_to_predicted_for_every_rank_and_kind(self):
        with tempfile.TemporaryDirectory() as d:
            # The trainer runs fp32 and, without ZeRO, holds every weight of its modules (under TP
            # its slices and the replicated tensors): the cost model's weights are then the
            # reference model's parameters x 4 bytes, its gradients as many, AdamW's m and v twice.
            config = variant(d, MLLM, "mllm-zero0.yaml", training={"zero_stage": 0, "precision": "fp32"})
            layouts = [("1", 1, (), self.MLLM_PARAMETERS), ("dp2", 2, (), self.MLLM_PARAMETERS),
                       ("tp2", 2, ("--strategy", "megatron", "--tp", "2"), self.MLLM_TP2_PARAMETERS)]
            for name, ranks, args, parameters in layouts:
                with self.subTest(layout=name):
                    m, stdout = self.train_memory(d, name, ranks, config, *args)
                    self.assertIn("memory per rank at its peak, measured and as the cost model predicts it", stdout)
                    for x in m["ranks"]:
                        rank, measured, predicted = x["rank"], x["measured_bytes"], x["predicted_bytes"]
                        self.assertEqual(set(measured), self.KINDS | self.MEASURED_ONLY)
                        self.assertEqual(set(predicted), self.KINDS)
                        for kind in ("weights", "activations"):
                            self.assertGreater(measured[kind], 0, f"rank {rank} {kind}")
                            self.assertGreater(predicted[kind], 0, f"rank {rank} {kind}")
                        # The printed table shows the JSON's figures.
                        row = re.search(rf"^{rank}\s+weights\s+([\d.]+)\s+([\d.]+)\s", stdout, re.M)
                        self.assertIsNotNone(row, stdout)
                        self.assertEqual(row.group(1), f"{measured['weights'] / 2**20:.3f}")
                        self.assertEqual(row.group(2), f"{predicted['weights'] / 2**20:.3f}")
                        self.assertEqual(measured["weights"], 4 * parameters,
                                         f"rank {rank}: the reference model holds {measured['weights'] / 4:.0f} "
                                         f"parameters, the hand count is {parameters}")
                        expected = {"weights": 4 * parameters, "gradients": 4 * parameters,
                                    "optimizer": 8 * parameters}
                        for kind in self.STATE:
                            self.assertEqual(measured[kind], expected[kind], f"rank {rank} {kind} measured")
                            self.assertEqual(predicted[kind], expected[kind], f"rank {rank} {kind} predicted")
                        # Data parallel, each module's all-reduce sums its gradients where they
                        # lie, laid out end to end: no copy, as with no DP group.
                        self.assertEqual(predicted["communication"], 0, f"rank {rank}")
                        self.assertEqual(measured["communication"], 0, f"rank {rank}")

    def test_zero_shards_optimizer_state_and_weights_as_predicted(self):
        # ZeRO over DP 2: stage 1 halves AdamW's state, stage 3 also the weights kept between uses.
        # A unit (a block, or the rest of a module) is padded to a multiple of the group, so a rank
        # may hold up to one element per unit more than 1/dp; every tensor of tiny-mllm has an even
        # number of elements, so nothing is padded and measured = predicted to the byte. A stage-3
        # backward gathers its module part whole, beside the shards, and the meter samples there
        # too: the peak holds the llm's weights (its largest module part) whole.
        with tempfile.TemporaryDirectory() as d:
            for zero in (1, 3):
                config = variant(d, MLLM, f"mllm-zero{zero}.yaml", training={"zero_stage": zero, "precision": "fp32"})
                with self.subTest(zero=zero):
                    m, _ = self.train_memory(d, f"zero{zero}", 2, config)
                    for x in m["ranks"]:
                        rank, measured, predicted = x["rank"], x["measured_bytes"], x["predicted_bytes"]
                        self.assertEqual(predicted["optimizer"], 8 * self.MLLM_PARAMETERS / 2)
                        self.assertEqual(measured["optimizer"], predicted["optimizer"], f"rank {rank}")
                        weights = 4 * (self.MLLM_PARAMETERS / 2 + self.LLM_PARAMETERS if zero == 3
                                       else self.MLLM_PARAMETERS)
                        self.assertEqual(predicted["weights"], weights)
                        self.assertEqual(measured["weights"], weights, f"rank {rank}")

    def test_zero_gradients_as_predicted(self):
        # ZeRO-1 keeps the whole gradients (its reduce-scatter lands in its own range of them);
        # ZeRO-2 and 3 keep 1/dp between instructions, and inside a backward a module part's
        # whole gradients until each unit's last call (one per image side) reduces it: at the
        # peak the shards and the llm's whole gradients, sampled as its reduce-scatter copies them.
        with tempfile.TemporaryDirectory() as d:
            for zero in (1, 2, 3):
                config = variant(d, MLLM, f"mllm-zero{zero}.yaml", training={"zero_stage": zero, "precision": "fp32"})
                m, _ = self.train_memory(d, f"zero{zero}", 2, config)
                gradients = 4 * (self.MLLM_PARAMETERS if zero == 1 else self.MLLM_PARAMETERS / 2 + self.LLM_PARAMETERS)
                for x in m["ranks"]:
                    self.assertEqual(x["predicted_bytes"]["gradients"], gradients, f"zero {zero}")
                    self.assertEqual(x["measured_bytes"]["gradients"], gradients, f"zero {zero} rank {x['rank']}")
                    # A unit's copy and shard, registered as communication, not activations: the
                    # largest unit (a block of the llm) padded to 2 shards and one of them, whether
                    # reduced inside the backward (2, 3) or after it (1), as the cost model predicts.
                    self.assertEqual(x["predicted_bytes"]["communication"], 4 * 3 * self.LLM_BLOCK / 2, f"zero {zero}")
                    self.assertEqual(x["measured_bytes"]["communication"], x["predicted_bytes"]["communication"],
                                     f"zero {zero} rank {x['rank']}")

    def test_collective_buffers_as_predicted_in_every_layout(self):
        # The DP collectives' buffers (communication) equal the cost model's on every rank: on a
        # device, where the all-reduce sums the laid-out gradients in place (none); in a
        # pipeline, whose sends in flight are another kind (messages), measured only; colocated
        # (Optimus) online, where the llm's reduce-scatters run beside the encoder's tasks.
        with tempfile.TemporaryDirectory() as d:
            zero0 = variant(d, MLLM, "z0.yaml", training={"zero_stage": 0, "precision": "fp32"})
            zero1 = variant(d, MLLM, "z1.yaml", training={"zero_stage": 1, "precision": "fp32"})
            layouts = [("device", 2, zero0, ("--device", "emulated")),
                       ("pipeline", 4, zero1, ("--strategy", "megatron", "--pp", "2", "--dp", "2")),
                       ("colocated", 4, zero1, ("--strategy", "optimus", "--pp", "2", "--schedule", "optimus-online"))]
            for name, ranks, config, args in layouts:
                with self.subTest(layout=name):
                    m, _ = self.train_memory(d, name, ranks, config, *args)
                    for x in m["ranks"]:
                        measured, predicted = x["measured_bytes"], x["predicted_bytes"]
                        self.assertEqual(predicted["communication"] > 0, name != "device", f"rank {x['rank']}")
                        self.assertEqual(measured["communication"], predicted["communication"], f"rank {x['rank']}")
                        self.assertNotIn("messages", predicted)
                        self.assertEqual(measured["messages"] > 0, name != "device", f"rank {x['rank']}")

    def test_a_stage_frees_the_sends_its_peer_took(self):
        # GPipe's first stage sends all 32 microbatches' hidden states before it waits for any
        # gradient. Each send's copy is freed once the send completed (at the next send), not
        # at the step's end: of 32 messages of 2 x 16-28 x 128 floats (32 px images: 16 image
        # tokens and up to 12 caption tokens) the first stage holds a few, where it held all 32
        # (at least 32 x 2 x 16 x 128 floats, above the bound), as its peer (the lighter stage:
        # the llm's second layer and head) waits for each; a peer starved of its core lets a
        # few more pile up. The second stage's gradients wait for the first stage's slower
        # backwards, so how many of them are out depends on the two speeds.
        largest = 2 * 28 * 128 * 4
        with tempfile.TemporaryDirectory() as d:
            with open(variant(d, MLLM, "fixed.yaml",
                              training={"precision": "fp32", "global_batch": 64, "microbatch": 2})) as f:
                text = f.read()
            with open(f"{d}/fixed.yaml", "w") as f:
                f.write("\n".join(l for l in text.splitlines() if "distribution:" not in l) + "\n")
            m, _ = self.train_memory(d, "gpipe", 2, f"{d}/fixed.yaml", "--strategy", "megatron", "--pp", "2",
                                     "--schedule", "gpipe")
            for x in m["ranks"]:
                self.assertGreater(x["measured_bytes"]["messages"], 0, f"rank {x['rank']}")
            self.assertLess(m["ranks"][0]["measured_bytes"]["messages"], 16 * largest)

    def test_zero_state_inside_an_instruction_as_predicted(self):
        # Every 32 px image one side: a microbatch calls each module once, so a ZeRO-2/3 backward
        # reduces each block right after its own backward and holds the llm's rest (12,544
        # parameters, through the call) and one block (198,272) whole beside the shards; ZeRO-3
        # still gathers the whole llm. DistTrain with the projector riding on the encoder's ranks
        # (tp 1, dp 2 each: vision + projector on ranks 0-1, the llm on 2-3): with several image
        # sides the encoder's backward holds both parts' gradients at once; with one, the
        # projector's are reduced before the vision backward takes its rest (12,992) and a block
        # (49,984). Measured = predicted on every rank.
        llm_once = self.MLLM_PARAMETERS / 2 + 12544 + 198272
        encoder_shards = (112960 + 24832) / 2
        encoder_grads = {"sides": encoder_shards + 112960 + 24832,
                         "fixed": encoder_shards + max(12992 + 49984, 24832)}
        with tempfile.TemporaryDirectory() as d:
            for zero in (2, 3):
                with open(variant(d, MLLM, f"fixed-{zero}.yaml", training={"zero_stage": zero, "precision": "fp32"})) as f:
                    text = f.read()
                text = "\n".join(l for l in text.splitlines() if "distribution:" not in l) + "\n"
                with open(f"{d}/fixed-{zero}.yaml", "w") as f:
                    f.write(text)
                with self.subTest(zero=zero, data="fixed"):
                    m, _ = self.train_memory(d, f"fixed{zero}", 2, f"{d}/fixed-{zero}.yaml")
                    for x in m["ranks"]:
                        self.assertEqual(x["predicted_bytes"]["gradients"], 4 * llm_once)
                        weights = self.MLLM_PARAMETERS / 2 + self.LLM_PARAMETERS if zero == 3 else self.MLLM_PARAMETERS
                        self.assertEqual(x["predicted_bytes"]["weights"], 4 * weights)
                        for kind in ("weights", "gradients"):
                            self.assertEqual(x["measured_bytes"][kind], x["predicted_bytes"][kind],
                                             f"zero {zero} rank {x['rank']} {kind}")
                sides = variant(d, MLLM, f"chain-{zero}.yaml", training={"zero_stage": zero, "precision": "fp32"})
                for data, config in (("sides", sides), ("fixed", f"{d}/fixed-{zero}.yaml")):
                    with self.subTest(zero=zero, layout="disttrain", data=data):
                        m, _ = self.train_memory(d, f"chain{zero}-{data}", 4, config, "--strategy", "disttrain",
                                                 "--dp", "2", "--tp", "1", "--pp", "1")
                        for x in m["ranks"]:
                            for kind in ("weights", "gradients"):
                                self.assertEqual(x["measured_bytes"][kind], x["predicted_bytes"][kind],
                                                 f"zero {zero} rank {x['rank']} {kind}")
                        self.assertEqual(m["ranks"][0]["predicted_bytes"]["gradients"], 4 * encoder_grads[data])

    def test_prediction_and_price_are_of_the_run_as_the_trainer_runs_it(self):
        # fp32, attention keeping its probabilities, no overlaps: a run file saying otherwise is
        # trained as the first, and its program priced and memory predicted so, saying what differs.
        with tempfile.TemporaryDirectory() as d:
            fp32 = variant(d, MLLM, "fp32.yaml", training={"zero_stage": 0, "precision": "fp32"})
            bf16 = variant(d, MLLM, "bf16.yaml", training={"zero_stage": 0, "precision": "bf16", "attention": "flash",
                                                           "overlap_grad_reduce": "true"})
            for name in ("fp32", "bf16"):
                r = train(1, "--config", f"{d}/{name}.yaml", "--steps", "1", "--metrics", f"{d}/{name}.jsonl")
                check(self, r)
            self.assertIn("(predicted in fp32, as the trainer runs; the run says bf16)", r.stdout)
            changed = ["precision fp32 (the run says bf16)", "attention standard (the run says flash)",
                       "overlap_grad_reduce false (the run says true)"]
            self.assertIn("priced as the trainer runs: " + ", ".join(changed) + "\n", r.stdout)
            a, b = self.memory_line(f"{d}/fp32.jsonl"), self.memory_line(f"{d}/bf16.jsonl")
            self.assertEqual((b["run_precision"], b["predicted_as"]), ("bf16", "fp32"))
            self.assertEqual(a["ranks"][0]["predicted_bytes"], b["ranks"][0]["predicted_bytes"])
            self.assertEqual(a["ranks"][0]["measured_bytes"]["weights"], b["ranks"][0]["measured_bytes"]["weights"])
            summary = {n: next(m for m in metrics(f"{d}/{n}.jsonl") if m.get("summary") and "priced_step_s" in m)
                       for n in ("fp32", "bf16")}
            self.assertEqual(summary["bf16"]["as_trained"], changed)
            self.assertNotIn("as_trained", summary["fp32"])
            self.assertEqual(summary["bf16"]["priced_step_s"], summary["fp32"]["priced_step_s"])
            self.assertEqual(losses(f"{d}/bf16.jsonl"), losses(f"{d}/fp32.jsonl"))


class ZeroResharding(Resharding):
    """The same under ZeRO-3: the checkpoint holds the tensor-parallel slices, each DP group's
    shards gathered into them; a resumed run cuts its own shards again (the weights' too)."""

    ZERO = 3


class KilledRank(unittest.TestCase):
    def test_others_exit_within_30s_and_the_last_checkpoint_resumes(self):
        with tempfile.TemporaryDirectory() as d:
            config = variant(d, CLIP, "clip.yaml", checkpoint_every=2, eval_every=0, eval_samples=32, steps=100000)
            proc = subprocess.Popen([*MPIEXEC, "-n", "2", CLI, "train", "--threads", "1", "--config", config,
                                     "--quiet", "--checkpoint-dir", d + "/ckpt"],
                                    cwd=SOURCE_DIR, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            try:
                deadline = time.time() + 120
                while not os.path.exists(os.path.join(d, "ckpt", "step-000004.braidckpt")):
                    self.assertIsNone(proc.poll(), "the run ended before its second checkpoint")
                    self.assertLess(time.time(), deadline, "no checkpoint within 120 s")
                    time.sleep(0.1)
                victim = rank_pid(proc.pid, 1)
                os.kill(victim, signal.SIGKILL)
                killed = time.time()
                out, _ = proc.communicate(timeout=30)
                self.assertLess(time.time() - killed, 30)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.communicate()
            self.assertNotEqual(proc.returncode, 0)
            self.assertRegex(out, r"rank 1\b", "the message names the lost rank:\n" + out)
            r = train(2, "--config", config, "--steps", "1", "--quiet", "--checkpoint-dir", d + "/ckpt", "--resume")
            # The newest committed checkpoint is intact: the resumed run starts from it (its step is
            # past --steps, so it trains nothing more and exits cleanly).
            check(self, r)
            self.assertRegex(r.stderr, r"resuming from step-0000\d\d")


def rank_pid(launcher, rank):
    """The pid of MPI rank `rank` among the launcher's descendants."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if b"train" in cmdline and env.get(b"OMPI_COMM_WORLD_RANK") == str(rank).encode() and \
                is_descendant(int(pid), launcher):
            return int(pid)
    raise AssertionError(f"no process of rank {rank} under {launcher}")


def is_descendant(pid, ancestor):
    while pid > 1:
        if pid == ancestor:
            return True
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            return False
    return False


@unittest.skipIf(os.environ.get("BRAID_TRAIN_LEARNING") == "0", "BRAID_TRAIN_LEARNING=0")
class Learning(unittest.TestCase):
    def test_tiny_clip_retrieves_held_out_captions(self):
        with tempfile.TemporaryDirectory() as d:
            r = train(2, "--config", CLIP, "--quiet", "--metrics", d + "/m.jsonl")
            check(self, r)
            final = [m for m in metrics(d + "/m.jsonl") if m.get("eval")][-1]
            self.assertGreaterEqual(final["retrieval_top1_i2t"], 0.9, r.stdout)
            self.assertGreaterEqual(final["retrieval_top1_t2i"], 0.9, r.stdout)

    def test_tiny_mllm_caption_loss_halves(self):
        with tempfile.TemporaryDirectory() as d:
            r = train(2, "--config", MLLM, "--quiet", "--metrics", d + "/m.jsonl")
            check(self, r)
            evals = [m for m in metrics(d + "/m.jsonl") if m.get("eval")]
            first = losses(d + "/m.jsonl")[0]
            self.assertLessEqual(evals[-1]["caption_loss"], first / 2, r.stdout)


if __name__ == "__main__":
    unittest.main()
