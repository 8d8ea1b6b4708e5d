"""Tests of the braid CLI, run as a subprocess from the repository root.

Environment: BRAID_CLI (the braid binary; required), BRAID_SOURCE_DIR (the repository;
default: two directories up). Run with
`python3 -m unittest discover -s tests/cli -p test_cli.py -v` or with pytest.
"""

import json
import os
import re
import subprocess
import tempfile
import unittest

SOURCE_DIR = os.path.abspath(
    os.environ.get("BRAID_SOURCE_DIR") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
)
CLI = os.environ.get("BRAID_CLI", "")

RUNS = ["clip-vit-l14-64gpu", "llava-13b-256gpu", "mllm-72b-1024gpu", "vit22b-gpt175b-3072gpu"]
USER_STRATEGIES = ["auto", "megatron", "distmm", "disttrain", "optimus"]
MODULE_KEYS = {"name", "role", "devices", "tp", "pp", "dp", "first_device", "layers_per_stage", "microbatch_size"}
ESTIMATE_KEYS = {"iteration_time_s", "samples_per_s", "tflops_per_device", "mfu", "peak_memory_gib",
                 "bubble_fraction"}
ALTERNATIVE_KEYS = {"strategy", "feasible", "iteration_time_s", "reason"}
CLIP = "configs/runs/clip-vit-l14-64gpu.yaml"
LLAVA = "configs/runs/llava-13b-256gpu.yaml"
VIT22B = "configs/runs/vit22b-gpt175b-3072gpu.yaml"
MLLM = "configs/runs/mllm-72b-1024gpu.yaml"
REORDERINGS = {"none", "intra", "intra_inter"}
DATA_REPORT_KEYS = {"heterogeneous", "seed", "samples_per_step", "steps", "dp_cells", "pipeline_groups",
                    "microbatches", "inter_ordered", "nominal_step_time_s", "mean", "per_step",
                    "search_evaluations", "cost_models", "report_s", "notes"}
SCHEDULES = ["gpipe", "1f1b", "interleaved", "batch-sync", "distmm-pipe", "two-phase"]
BUBBLE_CAUSES = {"dp_start", "dp_end", "dp_shard", "pp_warmup", "pp_cooldown", "pp_other", "tp", "batch_sync",
                 "imbalance"}
SIM_STAGE_KEYS = {"name", "replicas", "busy_s", "idle_s", "peak_memory_gib", "bubbles"}


def setUpModule():
    if not CLI:
        raise unittest.SkipTest("set BRAID_CLI to the braid binary (build/tools/braid)")


def braid(*args):
    return subprocess.run([CLI, *args], cwd=SOURCE_DIR, capture_output=True, text=True, timeout=300)


def run_config(config, *args):
    return braid("plan", "--config", config, *args)


class CliTestCase(unittest.TestCase):
    def assertExit(self, result, status):
        self.assertEqual(result.returncode, status,
                         f"exit {result.returncode}, expected {status}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}")

    def plan_json(self, config, *args):
        result = run_config(config, "--format", "json", *args)
        self.assertExit(result, 0)
        return json.loads(result.stdout)  # the whole output: exactly one JSON document

    def temp_file(self, text, name):
        directory = tempfile.TemporaryDirectory(prefix="braid-cli-")
        self.addCleanup(directory.cleanup)
        path = os.path.join(directory.name, name)
        with open(path, "w") as f:
            f.write(text)
        return path


class HelpTest(CliTestCase):
    def test_help(self):
        result = braid("--help")
        self.assertExit(result, 0)
        self.assertIn("plan", result.stdout)

    def test_plan_help(self):
        result = braid("plan", "--help")
        self.assertExit(result, 0)
        for strategy in USER_STRATEGIES:
            self.assertIn(strategy, result.stdout)
        for option in ("--config", "--strategy", "--tp", "--pp", "--dp", "--plan", "--format"):
            self.assertIn(option, result.stdout)

    def test_no_command(self):
        self.assertExit(braid(), 2)

    def test_unknown_command(self):
        result = braid("plna")
        self.assertExit(result, 2)
        self.assertIn("unknown command 'plna' (did you mean 'plan'?)", result.stderr)

    def test_info_json(self):
        result = braid("info", "--format", "json")
        self.assertExit(result, 0)
        info = json.loads(result.stdout)
        self.assertIn("version", info)
        self.assertIn("cuda", info)
        self.assertIsInstance(info["cuda"], bool)
        self.assertRegex(info["version"], r"^\d+\.\d+\.\d+$")

    def test_started_from_path_it_finds_its_plugins_next_to_itself(self):
        # `braid` found on PATH is started by a bare name: the plugins are still found next to
        # the binary, not under the working directory.
        env = {k: v for k, v in os.environ.items() if k != "BRAID_PLUGIN_PATH"}
        env["PATH"] = os.path.dirname(os.path.abspath(CLI)) + os.pathsep + env.get("PATH", "")
        with tempfile.TemporaryDirectory() as elsewhere:
            result = subprocess.run([os.path.basename(CLI), "info", "--format", "json"], cwd=elsewhere, env=env,
                                    capture_output=True, text=True, timeout=120)
        self.assertExit(result, 0)
        info = json.loads(result.stdout)
        here = braid("info", "--format", "json")
        self.assertTrue(info["plugin_path"], info)
        self.assertEqual(info["plugin_path"], json.loads(here.stdout)["plugin_path"])
        mpi = [p for p in info["plugins"] if p["name"] == "mpi"][0]
        self.assertTrue(mpi["path"].endswith("/libbraid-mpi.so"), mpi)

    def test_info_check_runs_the_host_backend_through_its_op_table(self):
        result = braid("info", "--check", "--format", "json")
        host = [p for p in json.loads(result.stdout)["plugins"] if p["name"] == "host"][0]
        self.assertEqual(host["interface"], 2)
        self.assertEqual(host["devices"][0]["self_test"], "ok (self-test; linear through the op table)")
        # A GPU-less machine has no device to check, so the exit status is the host's.
        cuda = [p for p in json.loads(result.stdout)["plugins"] if p["name"] == "cuda"]
        if not cuda or not cuda[0].get("devices"):
            self.assertExit(result, 0)


class PlanJsonTest(CliTestCase):
    def test_runs(self):
        for name in RUNS:
            with self.subTest(run=name):
                doc = self.plan_json(f"configs/runs/{name}.yaml")
                self.assertIsInstance(doc, dict)
                for key in ("strategy", "devices", "modules", "estimate", "alternatives"):
                    self.assertIn(key, doc)
                self.assertIn(doc["strategy"], USER_STRATEGIES)
                self.assertGreater(doc["devices"], 0)
                self.assertTrue(doc["modules"])
                for module in doc["modules"]:
                    self.assertLessEqual(MODULE_KEYS, set(module), module.get("name"))
                    self.assertEqual(len(module["layers_per_stage"]), module["pp"], module["name"])
                    self.assertLessEqual(module["first_device"] + module["devices"], doc["devices"], module["name"])
                self.assertLessEqual(ESTIMATE_KEYS, set(doc["estimate"]))
                self.assertGreater(doc["estimate"]["iteration_time_s"], 0)
                self.assertGreater(doc["estimate"]["samples_per_s"], 0)
                self.assertTrue(doc["alternatives"])
                for alt in doc["alternatives"]:
                    self.assertLessEqual(ALTERNATIVE_KEYS, set(alt))
                first = doc["alternatives"][0]
                self.assertEqual(first["strategy"], doc["strategy"])
                self.assertTrue(first["feasible"])
                self.assertEqual(first["reason"], "fastest")
                self.assertEqual(first["iteration_time_s"], doc["estimate"]["iteration_time_s"])

    def test_the_schedule_is_the_one_simulate_runs(self):
        # A colocated plan said "1f1b", which simulate and train refuse for it.
        for name in RUNS + ["tiny-mllm", "tiny-clip"]:
            with self.subTest(run=name):
                config = f"configs/runs/{name}.yaml"
                plan_file = self.temp_file(run_config(config, "--format", "yaml").stdout, name + ".yaml")
                schedule = self.plan_json(config)["schedule"]
                result = simulate(config, "--plan", plan_file, "--format", "json")
                self.assertExit(result, 0)
                self.assertEqual(json.loads(result.stdout)["schedule"], schedule)
                self.assertExit(simulate(config, "--plan", plan_file, "--schedule", schedule), 0)
        self.assertEqual(self.plan_json("configs/runs/tiny-mllm.yaml")["schedule"], "optimus-fine")
        # Given as a file, the colocated plan's estimate is still the fine schedule's.
        table = simulate("configs/runs/tiny-mllm.yaml", "--plan", self.temp_file(
            run_config("configs/runs/tiny-mllm.yaml", "--format", "yaml").stdout, "p.yaml")).stdout
        self.assertIn("(planner's estimate, the fine schedule: ", table)

    def test_megatron_constraints(self):
        doc = self.plan_json("configs/runs/vit22b-gpt175b-3072gpu.yaml", "--strategy", "megatron", "--tp", "8",
                             "--pp", "8")
        self.assertEqual(doc["strategy"], "megatron")
        for module in doc["modules"]:
            self.assertEqual(module["tp"], 8, module["name"])

    def test_yaml_round_trip(self):
        for name in ("clip-vit-l14-64gpu", "llava-13b-256gpu"):
            with self.subTest(run=name):
                config = f"configs/runs/{name}.yaml"
                searched = self.plan_json(config)
                result = run_config(config, "--format", "yaml")
                self.assertExit(result, 0)
                plan_file = self.temp_file(result.stdout, "plan.yaml")
                fixed = self.plan_json(config, "--plan", plan_file)
                self.assertEqual(fixed["estimate"]["iteration_time_s"], searched["estimate"]["iteration_time_s"])
                self.assertEqual([(m["name"], m["tp"], m["pp"], m["dp"]) for m in fixed["modules"]],
                                 [(m["name"], m["tp"], m["pp"], m["dp"]) for m in searched["modules"]])

    def test_table(self):
        result = run_config(CLIP, "--format", "table")
        self.assertExit(result, 0)
        self.assertIn("strategies compared", result.stdout)
        self.assertEqual(run_config(CLIP).stdout, result.stdout)  # table is the default


class PlanErrorTest(CliTestCase):
    def assertUsageError(self, result, *fragments):
        self.assertExit(result, 2)
        self.assertEqual(result.stdout, "")
        for fragment in fragments:
            self.assertIn(fragment, result.stderr)

    def test_missing_config(self):
        self.assertUsageError(braid("plan", "--format", "json"), "--config")

    def test_unknown_strategy(self):
        self.assertUsageError(run_config(CLIP, "--strategy", "megatorn"), "megatorn", "did you mean", "megatron")

    def test_bad_format(self):
        self.assertUsageError(run_config(CLIP, "--format", "xml"), "xml")

    def test_unknown_option(self):
        self.assertUsageError(run_config(CLIP, "--tensor-parallel", "8"), "tensor-parallel")

    def test_a_cluster_of_another_file_is_asked_what_the_run_needs(self):
        # An FP8 run on a cluster without an FP8 peak: the run file's field, as when the run
        # file names that cluster itself.
        fp8 = "configs/runs/megatron-core-h100/llama2-7b-8gpu.yaml"
        for command in ("plan", "simulate"):
            self.assertUsageError(
                braid(command, "--config", fp8, "--cluster", "configs/clusters/dgx-a100-80gb.yaml"),
                f"{fp8}: training.fp8: cluster 'dgx-a100-80gb' gives no FP8 peak",
                "(the cluster of --cluster 'configs/clusters/dgx-a100-80gb.yaml')")

    def test_a_misspelt_option_gets_the_nearest_one(self):
        self.assertUsageError(run_config(CLIP, "--stratgy", "megatron"),
                              "unrecognised option '--stratgy' (did you mean '--strategy'?)")

    def test_a_stray_word_is_refused(self):
        self.assertUsageError(run_config(CLIP, "megatron"), "unexpected word 'megatron': options begin with --")

    def test_an_empty_file_name_is_refused(self):
        # '' was taken as left out: the run's own cluster, or a search where --plan was given.
        self.assertUsageError(run_config(CLIP, "--cluster", ""), "--cluster names no file")
        self.assertUsageError(run_config(CLIP, "--plan", "", "--strategy", "megatron"), "--plan names no file")
        self.assertUsageError(braid("plan", "--config", ""), "--config names no file")
        self.assertUsageError(simulate(CLIP, "--trace", ""), "--trace names no file")

    def test_a_device_is_no_spec_file(self):
        # /dev/zero was read without end, growing memory.
        result = braid("plan", "--config", "/dev/zero")
        self.assertExit(result, 2)
        self.assertIn("'/dev/zero' is larger than 16 MiB: not a braid spec file", result.stderr)

    def test_a_width_of_zero_is_refused(self):
        # 0 was taken as "no constraint", where -1 was refused.
        for axis in ("--tp", "--pp", "--dp"):
            self.assertUsageError(run_config(CLIP, axis, "0"), "--tp, --pp and --dp must be positive")

    def test_plan_with_strategy(self):
        plan_file = self.temp_file(run_config(CLIP, "--format", "yaml").stdout, "plan.yaml")
        self.assertUsageError(run_config(CLIP, "--plan", plan_file, "--strategy", "megatron"), "--plan")

    def test_typo_in_run_file(self):
        run_file = self.temp_file(
            "name: clip-typo\n"
            f"model: {os.path.join(SOURCE_DIR, 'configs', 'models', 'clip-vit-l14.yaml')}\n"
            f"cluster: {os.path.join(SOURCE_DIR, 'configs', 'clusters', 'dgx-a100-80gb.yaml')}\n"
            "nodes: 8\n"
            "training:\n"
            "  global_batch: 28672\n"
            "  microbtach: 64\n"
            "data:\n"
            "  image: {resolution: 224}\n"
            "  text: {tokens: 77}\n",
            "typo-run.yaml")
        result = run_config(run_file, "--format", "json")
        self.assertUsageError(result, "typo-run.yaml", "microbtach", "did you mean", "microbatch")
        self.assertRegex(result.stderr, re.escape(run_file) + r":7:\d+:")

    def test_missing_config_file(self):
        result = run_config("configs/runs/no-such-run.yaml", "--format", "json")
        self.assertUsageError(result, "configs/runs/no-such-run.yaml")

    def test_infeasible(self):
        run_file = self.temp_file(
            "name: gpt-175b-one-node\n"
            f"model: {os.path.join(SOURCE_DIR, 'configs', 'models', 'gpt-175b.yaml')}\n"
            f"cluster: {os.path.join(SOURCE_DIR, 'configs', 'clusters', 'dgx-a100-80gb.yaml')}\n"
            "nodes: 1\n"
            "training: {global_batch: 64, microbatch: 1, recompute: full}\n"
            "data: {text: {tokens: 2048}}\n",
            "gpt175b-one-node.yaml")
        result = run_config(run_file, "--format", "json")
        self.assertExit(result, 3)
        self.assertEqual(result.stdout, "")
        self.assertIn("no plan fits", result.stderr)
        self.assertIn("it fits from", result.stderr)


def simulate(config, *args):
    return braid("simulate", "--config", config, *args)


class SimulateTest(CliTestCase):
    def simulate_json(self, config, *args):
        result = simulate(config, "--format", "json", *args)
        self.assertExit(result, 0)
        return json.loads(result.stdout)  # the whole output: exactly one JSON document

    def test_help(self):
        result = braid("simulate", "--help")
        self.assertExit(result, 0)
        for schedule in SCHEDULES:
            self.assertIn(schedule, result.stdout)
        for option in ("--config", "--strategy", "--schedule", "--trace", "--trace-replicas", "--gantt", "--format"):
            self.assertIn(option, result.stdout)

    def test_json(self):
        doc = self.simulate_json(VIT22B)
        self.assertIsInstance(doc, dict)
        for key in ("schedule", "step_time_s", "estimate_iteration_time_s", "bubble_fraction", "bubbles", "devices",
                    "peak_memory_gib", "mfu", "events", "device_count", "ranks"):
            self.assertIn(key, doc)
        self.assertGreater(doc["step_time_s"], 0)
        self.assertTrue(0 <= doc["bubble_fraction"] < 1)
        self.assertEqual(set(doc["bubbles"]), BUBBLE_CAUSES)
        self.assertTrue(all(v >= 0 for v in doc["bubbles"].values()))
        self.assertGreater(doc["peak_memory_gib"], 0)
        self.assertTrue(0 < doc["mfu"] < 1)
        self.assertGreater(doc["events"], 0)
        self.assertEqual(doc["device_count"], 3072)
        self.assertTrue(doc["devices"])  # busy/idle per stage
        for stage in doc["devices"]:
            self.assertLessEqual(SIM_STAGE_KEYS, set(stage), stage.get("name"))
            self.assertEqual(set(stage["bubbles"]), BUBBLE_CAUSES)
            self.assertGreaterEqual(stage["replicas"], 1)
            self.assertGreater(stage["busy_s"], 0)
            self.assertGreaterEqual(stage["idle_s"], 0)
            self.assertGreater(stage["peak_memory_gib"], 0)
        # The simulated step agrees with the planner's closed form.
        self.assertAlmostEqual(doc["step_time_s"], doc["estimate_iteration_time_s"],
                               delta=0.02 * doc["estimate_iteration_time_s"])

    def test_trace_and_gantt(self):
        directory = tempfile.TemporaryDirectory(prefix="braid-cli-")
        self.addCleanup(directory.cleanup)
        trace = os.path.join(directory.name, "step.json")
        result = simulate(LLAVA, "--strategy", "megatron", "--tp", "8", "--pp", "4", "--trace", trace, "--gantt")
        self.assertExit(result, 0)
        with open(trace) as f:
            doc = json.load(f)
        self.assertIn("traceEvents", doc)
        self.assertTrue(any(e.get("ph") == "X" for e in doc["traceEvents"]))
        self.assertIn("schedule 1f1b", result.stdout)
        self.assertIn(trace, result.stdout)
        gantt_rows = [line for line in result.stdout.splitlines() if "stage 3 (llm) |" in line]
        self.assertEqual(len(gantt_rows), 1, result.stdout)
        self.assertTrue(gantt_rows[0].rstrip().endswith("|"), gantt_rows[0])

    def test_unsupported_schedule(self):
        result = simulate(LLAVA, "--strategy", "megatron", "--schedule", "zigzag")
        self.assertExit(result, 2)
        self.assertEqual(result.stdout, "")
        for fragment in ("zigzag", "1f1b", "gpipe"):
            self.assertIn(fragment, result.stderr)

    def test_distmm_pipe(self):
        doc = self.simulate_json(CLIP, "--strategy", "distmm", "--schedule", "distmm-pipe")
        self.assertEqual(doc["strategy"], "distmm")
        self.assertEqual(doc["schedule"], "distmm-pipe")
        self.assertGreater(doc["step_time_s"], 0)
        self.assertGreater(doc["bubbles"]["batch_sync"], 0)

    def test_bad_options(self):
        for args, fragment in ((["--format", "xml"], "--format"), (["--trace-replicas", "-2"], "--trace-replicas"),
                               (["--trace-replicas", "0"], "--trace-replicas must be -1 (all) or at least 1")):
            with self.subTest(args=args):
                result = simulate(CLIP, *args)
                self.assertExit(result, 2)
                self.assertEqual(result.stdout, "")
                self.assertIn(fragment, result.stderr)


class SimulateBubbleTest(CliTestCase):
    """Colocated (optimus) plans: the bubble scheduler's three schedules and its report."""

    SHALLOW = "configs/plans/vit22b-gpt175b-3072gpu-shallow-encoder.yaml"

    def report(self, *args):
        result = simulate(VIT22B, "--format", "json", *args)
        self.assertExit(result, 0)
        return json.loads(result.stdout)

    def test_json_report(self):
        doc = self.report("--plan", self.SHALLOW)
        self.assertEqual(doc["schedule"], "optimus-fine")
        r = doc["bubble_report"]
        self.assertEqual(set(r["step_time_s"]), {"colocated", "coarse", "fine"})
        self.assertEqual(set(r["recovered_fraction"]), {"coarse", "fine"})
        self.assertEqual(set(r["bubbles_before"]), BUBBLE_CAUSES)
        self.assertEqual(set(r["bubbles_after"]), BUBBLE_CAUSES)
        t = r["step_time_s"]
        # A shallow encoder pipeline leaves work to move: coarse gains, fine keeps at least that.
        self.assertLess(t["coarse"], t["colocated"])
        self.assertLessEqual(t["fine"], t["coarse"] * (1 + 1e-12))
        self.assertAlmostEqual(doc["step_time_s"], t["fine"], delta=1e-9 * t["fine"])
        self.assertTrue(0 < r["recovered_fraction"]["coarse"] <= r["recovered_fraction"]["fine"] < 1)
        self.assertLess(sum(r["bubbles_after"].values()), sum(r["bubbles_before"].values()))
        # Forwards before the llm's first instruction run behind its parameter all-gather,
        # backwards after its last backward behind its gradient reduction.
        self.assertGreater(r["dp_wait_tasks"], 0)
        self.assertIn("tp_bubble_tasks", r)
        self.assertGreater(r["encoder_tasks_per_device"], 0)
        self.assertGreaterEqual(r["scheduler_time_s"], 0)
        # Against the llm alone: H = encoder_s - (step - llm step), over encoder_s and over the llm's idle time.
        alone = r["llm_alone"]
        for name, step in (("colocated", t["colocated"]), ("coarse", t["coarse"]), ("fine", t["fine"])):
            h = max(0.0, r["encoder_s"] - (step - alone["step_time_s"]))
            self.assertAlmostEqual(r["encoder_in_bubbles_fraction"][name], h / r["encoder_s"], delta=1e-9)
            self.assertAlmostEqual(r["llm_bubble_filled_fraction"][name], h / alone["idle_s"], delta=1e-9)
        self.assertEqual(r["optimus_published_fraction"], {"coarse": 0.687, "fine": 0.85})
        # The planner's own plan is scored by its fine schedule.
        chosen = self.report("--strategy", "optimus")
        self.assertAlmostEqual(chosen["estimate_iteration_time_s"], chosen["bubble_report"]["step_time_s"]["fine"],
                               delta=1e-9 * chosen["estimate_iteration_time_s"])

    def test_each_schedule_and_the_table(self):
        steps = {}
        for schedule in ("encoder-first", "optimus-coarse", "optimus-fine"):
            doc = self.report("--plan", self.SHALLOW, "--schedule", schedule)
            self.assertEqual(doc["schedule"], schedule)
            steps[schedule] = doc["step_time_s"]
        t = doc["bubble_report"]["step_time_s"]
        self.assertAlmostEqual(steps["encoder-first"], t["colocated"], delta=1e-9 * t["colocated"])
        self.assertAlmostEqual(steps["optimus-coarse"], t["coarse"], delta=1e-9 * t["coarse"])
        result = simulate(VIT22B, "--plan", self.SHALLOW)
        self.assertExit(result, 0)
        self.assertIn("bubble scheduler (optimus)", result.stdout)
        self.assertIn("tasks inside TP waits", result.stdout)
        self.assertIn("in the llm's DP waits", result.stdout)
        result = simulate(VIT22B, "--plan", self.SHALLOW, "--schedule", "1f1b")
        self.assertExit(result, 2)
        self.assertIn("optimus-fine", result.stderr)


class SimulateDataTest(CliTestCase):
    """`braid simulate --data`: data reordering over the run's sample-size distributions."""

    def test_json_report_on_skewed_data(self):
        result = simulate(MLLM, "--strategy", "disttrain", "--data", "--format", "json")
        self.assertExit(result, 0)
        doc = json.loads(result.stdout)
        report = doc["data_report"]
        self.assertEqual(set(report), DATA_REPORT_KEYS)
        self.assertTrue(report["heterogeneous"])
        self.assertTrue(report["inter_ordered"])
        self.assertEqual(report["steps"], 8)  # data.steps of the run file
        self.assertEqual(len(report["per_step"]), 8)
        self.assertEqual(report["samples_per_step"], 1024)
        self.assertEqual(report["dp_cells"] * report["microbatches"], 1024)  # microbatch size 1
        for entry in report["per_step"] + [report["mean"]]:
            times, stragglers = entry["step_time_s"], entry["straggler"]
            self.assertEqual(set(times), REORDERINGS)
            self.assertEqual(set(stragglers), REORDERINGS)
            self.assertLessEqual(times["intra_inter"], times["none"])
            for s in stragglers.values():
                self.assertGreaterEqual(s["ratio"], 1)
                self.assertGreaterEqual(s["time_s"], 0)
        self.assertIn("stage", report["per_step"][0]["straggler"]["none"])
        self.assertEqual([s["step"] for s in report["per_step"]], list(range(8)))
        self.assertLess(report["mean"]["step_time_s"]["intra_inter"], report["mean"]["step_time_s"]["none"])
        # Intra-step reordering balances a step's replicas for its time, not for the straggler
        # ratio of each stage: that falls over the steps, not in every one of them.
        mean = report["mean"]["straggler"]
        self.assertLess(mean["intra"]["ratio"], mean["none"]["ratio"])

    def test_sizes_too_far_past_the_nominal_ones_are_named(self):
        # A histogram value of 64000 px on a 32 px run failed inside the simulator: "a
        # work_scale is not a load", naming neither the data nor the step.
        with open(os.path.join(SOURCE_DIR, "configs/runs/tiny-mllm.yaml")) as f:
            run = f.read()
        line = "distribution: {kind: lognormal, median: 24, sigma: 0.3, min: 16, max: 32}"
        assert run.count(line) == 1, "tiny-mllm's image distribution changed"
        run = run.replace(line, "distribution: {kind: histogram, values: [16, 64000], weights: [1, 1]}")
        run = run.replace("../", os.path.join(SOURCE_DIR, "configs") + "/")
        result = simulate(self.temp_file(run, "huge.yaml"), "--strategy", "optimus", "--data")
        self.assertExit(result, 2)
        self.assertIn("data: step 0 draws a microbatch that stage 'stage 0 (projector, llm)' would run", result.stderr)
        self.assertIn("the distributions' sizes (max, values) lie too far past the nominal sizes", result.stderr)

    def test_ordering_microbatches_never_undoes_the_intra_gain(self):
        # The order search once ignored the stages' gradient reductions and optimizer steps and
        # took an order that ended tiny-mllm's llm later: intra + inter slower than intra.
        result = simulate("configs/runs/tiny-mllm.yaml", "--strategy", "disttrain", "--data", "--format", "json")
        self.assertExit(result, 0)
        report = json.loads(result.stdout)["data_report"]
        self.assertTrue(report["inter_ordered"])
        for entry in report["per_step"] + [report["mean"]]:
            times = entry["step_time_s"]
            self.assertLessEqual(times["intra_inter"], times["intra"] * (1 + 1e-9), entry)

    def test_table_without_a_distribution_is_all_equal(self):
        result = simulate(LLAVA, "--strategy", "megatron", "--data")
        self.assertExit(result, 0)
        self.assertIn("data reordering:", result.stdout)
        self.assertIn("no size distribution", result.stdout)
        mean = [line for line in result.stdout.splitlines() if line.strip().startswith("mean")]
        self.assertEqual(len(mean), 1, result.stdout)
        self.assertIn("1.00x", mean[0])
        doc = json.loads(simulate(LLAVA, "--strategy", "megatron", "--data", "--format", "json").stdout)
        report = doc["data_report"]
        self.assertFalse(report["heterogeneous"])
        times = report["mean"]["step_time_s"]
        for v in times.values():
            self.assertAlmostEqual(v, report["nominal_step_time_s"], delta=1e-9 * v)
        self.assertAlmostEqual(doc["step_time_s"], report["nominal_step_time_s"], delta=1e-9 * doc["step_time_s"])

    def test_contrastive_batch_sync_is_not_supported_yet(self):
        trace = self.temp_file("an earlier trace", "trace.json")
        result = simulate(CLIP, "--strategy", "distmm", "--data", "--trace", trace)
        self.assertExit(result, 2)
        self.assertIn("contrastive batch-sync", result.stderr)
        with open(trace) as f:
            self.assertEqual(f.read(), "an earlier trace", "a refused run leaves the earlier trace")



class DataTest(CliTestCase):
    """`braid data`: samples of the generated image-caption dataset."""

    TINY = "configs/runs/tiny-mllm.yaml"

    def test_a_model_whose_tables_the_captions_overflow_is_refused_as_braid_train_refuses_it(self):
        run, model_path = self.run_with_model_edit("    vocab: 32", "    vocab: 24")
        result = braid("data", "--config", run)
        self.assertExit(result, 2)
        self.assertIn(f"({model_path}): module 'llm' has vocab 24; braid train's captions use 28 token ids",
                      result.stderr)

    def test_json_samples_follow_the_run(self):
        result = braid("data", "--config", self.TINY, "--show", "6", "--first", "3", "--format", "json")
        self.assertExit(result, 0)
        doc = json.loads(result.stdout)
        self.assertEqual(doc["seed"], 1)  # data.seed of the run file
        self.assertEqual(doc["sides"], "lognormal")
        self.assertEqual(doc["patch"], 8)  # the image encoder's
        self.assertEqual((doc["min_side"], doc["max_side"]), (16, 32))  # on the grid, up to max_image_size
        self.assertEqual(doc["vocab_size"], 28)
        self.assertEqual([s["index"] for s in doc["samples"]], list(range(3, 9)))
        for s in doc["samples"]:
            self.assertEqual(s["side"] % 8, 0)
            self.assertTrue(16 <= s["side"] <= 32)  # up to the encoder's max_image_size
            self.assertEqual(s["tokens"][0], 1)  # <bos>
            self.assertEqual(s["tokens"][-1], 2)  # <eos>
            self.assertEqual(len(s["tokens"]), len(s["caption"].split()) + 2)
        again = json.loads(braid("data", "--config", self.TINY, "--show", "1", "--first", "5", "--format",
                                 "json").stdout)
        self.assertEqual(again["samples"][0], doc["samples"][2])  # sample 5 whatever the range read

    def run_with_model_edit(self, line, replacement):
        """tiny-mllm's run with one line of its model file replaced: (the run file, the model file)."""
        with open(os.path.join(SOURCE_DIR, "configs/models/tiny-mllm.yaml")) as f:
            model = f.read()
        assert model.count(line) == 1, f"tiny-mllm's model changed: {line!r}"
        model_path = self.temp_file(model.replace(line, replacement), "model.yaml")
        with open(os.path.join(SOURCE_DIR, self.TINY)) as f:
            run = f.read()
        run = run.replace("model: ../models/tiny-mllm.yaml", "model: " + model_path)
        run = run.replace("cluster: ../", "cluster: " + os.path.join(SOURCE_DIR, "configs") + "/")
        return self.temp_file(run, "run.yaml"), model_path

    def oversized_run(self):
        """tiny-mllm with its image encoder's max_image_size past what the dataset renders."""
        return self.run_with_model_edit("max_image_size: 32", "max_image_size: 2048")[0]

    def test_a_distribution_in_other_units_is_scaled_whole(self):
        # 224-896 (the 72B run's unit) onto the encoder's 32 px: the min scales with the draws.
        # It was taken as 224 px (refused), and a min of 32 on a max of 64 drew every image at 32.
        with open(os.path.join(SOURCE_DIR, self.TINY)) as f:
            run = f.read()
        old = "distribution: {kind: lognormal, median: 24, sigma: 0.3, min: 16, max: 32}"
        self.assertIn(old, run)
        run = run.replace(old, "distribution: {kind: lognormal, median: 336, sigma: 0.5, min: 224, max: 896}")
        run = run.replace("model: ../", "model: " + os.path.join(SOURCE_DIR, "configs") + "/")
        run = run.replace("cluster: ../", "cluster: " + os.path.join(SOURCE_DIR, "configs") + "/")
        path = self.temp_file(run, "run.yaml")
        result = braid("data", "--config", path, "--show", "200", "--format", "json")
        self.assertExit(result, 0)
        doc = json.loads(result.stdout)
        self.assertEqual((doc["min_side"], doc["max_side"]), (8, 32))
        self.assertGreaterEqual(len({s["side"] for s in doc["samples"]}), 3, "the sizes vary")

    def test_table_shows_captions_and_thumbnails(self):
        result = braid("data", "--show", "2", "--columns", "8", "--split", "heldout")
        self.assertExit(result, 0)
        self.assertIn("heldout split, every image 64 px (fixed)", result.stdout)  # no range: one side
        self.assertEqual(len(re.findall(r"^sample \d+: 64 x 64 px", result.stdout, re.M)), 2, result.stdout)
        rows = [line for line in result.stdout.splitlines() if line.startswith("  |")]
        self.assertEqual(len(rows), 16)
        self.assertTrue(all(re.fullmatch(r"  \|[.rgbypcw]{8}\|", row) for row in rows), rows)
        self.assertTrue(any(set(row) - set(" |.") for row in rows), rows)  # some object shows

    def test_bad_options(self):
        for args, fragment in [(["--split", "test"], "--split must be train or heldout"),
                               (["--patch", "0"], "--patch must be in [1, 64]"),
                               (["--patch", "80"], "--patch must be in [1, 64]"),
                               # 2^31 - 1 overflowed the grid's check into images of 0 px
                               (["--patch", str(2**31 - 1)], "--patch must be in [1, 64]"),
                               (["--config", ""], "--config names no file"),
                               (["extra"], "unexpected word 'extra'"),
                               (["--config", self.TINY, "--patch", "4"], "--patch is the run's image encoder's"),
                               (["--first", str(2**63 - 1)], "--first + --show is past 2^63 - 1"),
                               (["--config", MLLM], "which 'vision' does not set"),
                               (["--config", self.oversized_run()],
                                "image encoder 'vision' has max_image_size 2048; braid train's generated images are "
                                "at most 1024 px a side")]:
            with self.subTest(args=args):
                result = braid("data", *args)
                self.assertExit(result, 2)
                self.assertIn(fragment, result.stderr)

class GroupsTest(CliTestCase):
    """`braid groups`: the process groups of a plan on N ranks."""

    KEYS = {"strategy", "layout", "world_size", "modules", "stages", "ranks", "groups", "links", "batch_sync"}

    def groups_json(self, config, ranks, *args):
        result = braid("groups", "--config", config, "--ranks", str(ranks), "--format", "json", *args)
        self.assertExit(result, 0)
        return json.loads(result.stdout)  # the whole output: exactly one JSON document

    def assertPartitions(self, doc):
        """Every rank of a module is in exactly one group per axis, and holds that module."""
        for module in doc["modules"]:
            ranks = set(range(module["first_rank"], module["first_rank"] + module["ranks"]))
            for axis in ("tp", "dp", "pp"):
                members = [r for g in doc["groups"] if g["module"] == module["name"] and g["axis"] == axis
                           for r in g["ranks"]]
                self.assertEqual(sorted(members), sorted(ranks), f"{module['name']}.{axis}")
            for r in ranks:
                self.assertIn(module["name"], [h["module"] for h in doc["ranks"][r]["holds"]])

    def test_help(self):
        result = braid("groups", "--help")
        self.assertExit(result, 0)
        for option in ("--config", "--ranks", "--strategy", "--plan", "--format", "--all", "fan"):
            self.assertIn(option, result.stdout)
        self.assertIn("groups", braid("--help").stdout)

    def test_a_plan_file_for_another_world_is_named(self):
        # The error named the run file's plan where --plan gave one.
        plan = braid("plan", "--config", "configs/runs/tiny-mllm.yaml", "--strategy", "megatron", "--tp", "1",
                     "--pp", "1", "--format", "yaml")
        self.assertExit(plan, 0)
        self.assertIn("\ndevices: 4\n", plan.stdout)
        path = self.temp_file(plan.stdout, "plan.yaml")
        result = braid("groups", "--config", "configs/runs/tiny-mllm.yaml", "--ranks", "2", "--plan", path)
        self.assertExit(result, 2)
        self.assertIn(f"the plan runs on 4 devices but the world has 2 ranks: start one rank per device (the plan of "
                      f"{path})", result.stderr)

    def test_json_distmm_batch_sync(self):
        doc = self.groups_json(CLIP, 64, "--strategy", "distmm")
        self.assertLessEqual(self.KEYS, set(doc))
        self.assertEqual((doc["strategy"], doc["layout"], doc["world_size"]), ("distmm", "branches", 64))
        self.assertEqual([r["rank"] for r in doc["ranks"]], list(range(64)))
        self.assertTrue(all(r["holds"] for r in doc["ranks"]))
        self.assertPartitions(doc)
        self.assertEqual(doc["links"], [])
        (sync,) = doc["batch_sync"]
        self.assertEqual(sync["name"], "contrastive_loss.batch_sync")
        self.assertEqual(sorted(sync["ranks"]), list(range(64)))
        towers = [m["module"] for m in sync["members"]]
        self.assertEqual(towers, sorted(towers, key=["image_encoder", "text_encoder"].index))  # by tower, then replica
        dp = {m["name"]: m["dp"] for m in doc["modules"]}
        self.assertEqual(len(sync["members"]), dp["image_encoder"] + dp["text_encoder"])

    def test_json_disttrain_links_fan_in(self):
        plan = self.plan_json(LLAVA, "--strategy", "disttrain")
        doc = self.groups_json(LLAVA, plan["devices"], "--strategy", "disttrain")
        self.assertPartitions(doc)
        dp = {m["name"]: m["dp"] for m in doc["modules"]}
        self.assertEqual([(l["from"], l["to"]) for l in doc["links"]], [("vision", "projector"), ("projector", "llm")])
        self.assertTrue(doc["links"][0]["local"])
        link = doc["links"][1]
        self.assertFalse(link["local"])
        a, b = dp["projector"], dp["llm"]
        self.assertGreater(a, b)
        self.assertEqual(len(link["pairs"]), a)
        for pair in link["pairs"]:
            self.assertEqual(pair["to_replica"], pair["from_replica"] // (a // b))  # fan-in, as pipeline.h says
        # Stages sit on the devices the plan gives each module.
        for module in plan["modules"]:
            (ours,) = [m for m in doc["modules"] if m["name"] == module["name"]]
            self.assertEqual(ours["first_rank"], module["first_device"])
            self.assertEqual(ours["ranks"], module["devices"])

    def test_text_summary_and_all(self):
        result = braid("groups", "--config", "configs/runs/pipeline-demo.yaml", "--strategy", "megatron",
                       "--tp", "2", "--pp", "4", "--ranks", "8")
        self.assertExit(result, 0)
        self.assertRegex(result.stdout, r"gpt\.pp\[dp=0,tp=1\] +1,3,5,7\n")
        self.assertRegex(result.stdout, r"gpt\.tp\[pp=2,dp=0\] +4-5\n")
        self.assertIn("gpt stage 3 tp 1 dp 0", result.stdout)  # rank 7
        big = braid("groups", "--config", LLAVA, "--strategy", "megatron", "--ranks", "256")
        self.assertExit(big, 0)
        self.assertRegex(big.stdout, r"\.\.\. \(\d+ more\)")
        self.assertLess(len(big.stdout.splitlines()), 120)
        every = braid("groups", "--config", LLAVA, "--strategy", "megatron", "--ranks", "256", "--all")
        self.assertExit(every, 0)
        self.assertNotIn("more)", every.stdout)
        self.assertIn("\n  255    ", every.stdout)

    def test_wrong_ranks(self):
        result = braid("groups", "--config", CLIP, "--strategy", "distmm", "--ranks", "32")
        self.assertExit(result, 2)
        self.assertEqual(result.stdout, "")
        self.assertIn("64 devices", result.stderr)
        self.assertIn("32 ranks", result.stderr)

    def test_bad_options(self):
        for args, fragment in ((["--config", CLIP], "--ranks"),
                               (["--config", CLIP, "--ranks", "0"], "--ranks must be at least 1"),
                               (["--config", CLIP, "--ranks", "64", "--format", "yaml"], "--format"),
                               (["--ranks", "64"], "--config")):
            with self.subTest(args=args):
                result = braid("groups", *args)
                self.assertExit(result, 2)
                self.assertEqual(result.stdout, "")
                self.assertIn(fragment, result.stderr)


if __name__ == "__main__":
    unittest.main()
