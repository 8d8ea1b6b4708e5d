"""Tests of the Python binding (integrations/python/braid) against the real libbraid.so.

Environment: BRAID_LIBRARY (the libbraid.so to test; required), BRAID_SOURCE_DIR (the
repository, for configs/; default: two directories up). Run with
`python3 -m unittest discover -s tests/python -p test_binding.py -v` or with pytest.
"""

import gc
import json
import os
import sys
import tempfile
import unittest

SOURCE_DIR = os.path.abspath(
    os.environ.get("BRAID_SOURCE_DIR") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
)
try:
    import braid
except ImportError:  # not on PYTHONPATH: use the package of this checkout
    sys.path.insert(0, os.path.join(SOURCE_DIR, "integrations", "python"))
    import braid

CLIP = os.path.join(SOURCE_DIR, "configs", "runs", "clip-vit-l14-64gpu.yaml")
VIT22B = os.path.join(SOURCE_DIR, "configs", "runs", "vit22b-gpt175b-3072gpu.yaml")
MLLM = os.path.join(SOURCE_DIR, "configs", "runs", "mllm-72b-1024gpu.yaml")

GPT175B_ON_ONE_NODE = """\
name: gpt-175b-one-node
model: configs/models/gpt-175b.yaml
cluster: configs/clusters/dgx-a100-80gb.yaml
nodes: 1
training: {global_batch: 64, microbatch: 1, recompute: full}
data: {text: {tokens: 2048}}
"""

LLAVA_32GPU = """\
name: llava-13b-32gpu
model: ../models/llava-13b.yaml
cluster: ../clusters/dgx-a100-80gb.yaml
nodes: 4
training: {global_batch: 32, microbatch: 1, zero_stage: 1, recompute: full}
data: {image: {resolution: 336}, text: {tokens: 1472}}
"""

CLIP_WITH_TYPO = """\
name: clip-typo
model: ../models/clip-vit-l14.yaml
cluster: ../clusters/dgx-a100-80gb.yaml
nodes: 8
training:
  global_batch: 28672
  microbtach: 64
data:
  image: {resolution: 224}
  text: {tokens: 77}
"""


def setUpModule():
    if not os.environ.get("BRAID_LIBRARY"):
        raise unittest.SkipTest("set BRAID_LIBRARY to build/capi/libbraid.so to test the binding")


def by_name(modules):
    return {m["name"]: m for m in modules}


class LibraryTest(unittest.TestCase):
    def test_loads_the_library_from_braid_library(self):
        lib = braid.load_library()
        self.assertEqual(os.path.realpath(lib._name), os.path.realpath(os.environ["BRAID_LIBRARY"]))
        self.assertIs(braid.load_library(), lib)  # cached

    def test_versions(self):
        self.assertEqual(braid.abi_version(), braid.ABI_VERSION)
        self.assertEqual(braid.abi_version(), 1)
        parts = braid.version().split(".")
        self.assertEqual(len(parts), 3)
        self.assertTrue(all(p.isdigit() for p in parts), braid.version())
        self.assertEqual(braid.status_string(3), "infeasible")

    def test_abi_check_refuses_another_version(self):
        with self.assertRaises(braid.BraidError) as cm:
            braid._check_abi(braid.abi_version(), expected=braid.ABI_VERSION + 1, path="libbraid.so")
        self.assertIsInstance(cm.exception, braid.AbiMismatchError)
        self.assertIn("ABI version", str(cm.exception))
        braid._check_abi(braid.abi_version())  # the matching version passes

    def test_abi_mismatch_when_loading(self):
        saved = braid.ABI_VERSION
        braid._reset_library()
        braid.ABI_VERSION = saved + 1
        try:
            with self.assertRaises(braid.BraidError) as cm:
                braid.version()
            self.assertIn(os.environ["BRAID_LIBRARY"], str(cm.exception))
            self.assertIn(f"ABI version {saved + 1}", str(cm.exception))
        finally:
            braid.ABI_VERSION = saved
            braid._reset_library()
        self.assertEqual(braid.abi_version(), saved)

    def test_missing_library_path(self):
        saved = os.environ["BRAID_LIBRARY"]
        braid._reset_library()
        os.environ["BRAID_LIBRARY"] = os.path.join(tempfile.gettempdir(), "no-such-dir", "libbraid.so")
        try:
            with self.assertRaises(braid.BraidError) as cm:
                braid.version()
            self.assertIn("no-such-dir", str(cm.exception))
        finally:
            os.environ["BRAID_LIBRARY"] = saved
            braid._reset_library()

    def test_error_classes(self):
        for status, cls in [(1, braid.InvalidArgumentError), (2, braid.BadConfigError), (3, braid.InfeasibleError),
                            (4, braid.BraidIOError), (5, braid.UnsupportedError)]:
            e = braid.BraidError(status, "message")
            self.assertIsInstance(e, cls)
            self.assertIsInstance(e, braid.BraidError)
            self.assertEqual(e.status, status)
            self.assertEqual(str(e), "message")


class PlanTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.config = braid.Config.from_file(CLIP)

    @classmethod
    def tearDownClass(cls):
        cls.config.close()

    def test_devices(self):
        self.assertEqual(self.config.devices, 64)

    def test_auto(self):
        with braid.plan(self.config, strategy="auto") as p:
            self.assertIn(p.strategy, braid.STRATEGIES)
            alts = p.alternatives
            self.assertEqual(len(alts), 4)
            self.assertEqual(alts[0]["reason"], "fastest")
            self.assertTrue(alts[0]["feasible"])
            self.assertEqual(alts[0]["strategy"], p.strategy)
            self.assertEqual({a["strategy"] for a in alts}, {"megatron", "distmm", "disttrain", "optimus"})
            for a in alts:
                self.assertTrue(a["reason"])
                if a["feasible"]:
                    self.assertGreaterEqual(a["iteration_time_s"], alts[0]["iteration_time_s"])
                else:
                    self.assertIsNone(a["iteration_time_s"])

            est = p.estimate
            self.assertEqual(set(est), {"iteration_time_s", "samples_per_s", "tflops_per_device", "mfu",
                                        "peak_memory_gib", "bubble_fraction", "devices"})
            for key in ("iteration_time_s", "samples_per_s", "tflops_per_device", "mfu", "peak_memory_gib"):
                self.assertGreater(est[key], 0, key)
            self.assertLess(est["mfu"], 1)
            self.assertGreaterEqual(est["bubble_fraction"], 0)
            self.assertEqual(est["iteration_time_s"], alts[0]["iteration_time_s"])
            self.assertTrue(0 < est["devices"] <= 64)

            modules = p.modules
            self.assertEqual(set(by_name(modules)), {"image_encoder", "text_encoder"})
            for m in modules:
                self.assertEqual(m["role"], "encoder")
                self.assertGreaterEqual(m["first_device"], 0)
                self.assertGreater(m["devices"], 0)
                self.assertLessEqual(m["first_device"] + m["devices"], 64)
                self.assertEqual(m["tp"] * m["pp"] * m["dp"], m["devices"])
                self.assertEqual(len(m["layers_per_stage"]), m["pp"])
                self.assertGreater(m["microbatch_size"], 0)

    def test_struct_fields_match_json(self):
        with braid.plan(self.config) as p:
            doc = p.to_json()
            self.assertEqual(doc["strategy"], p.strategy)
            self.assertEqual(doc["devices"], p.estimate["devices"])
            for key, value in p.estimate.items():
                if key != "devices":
                    self.assertEqual(doc["estimate"][key], value, key)
            self.assertEqual(len(doc["modules"]), len(p.modules))
            for from_json, from_struct in zip(doc["modules"], p.modules):
                for key, value in from_struct.items():
                    self.assertEqual(from_json[key], value, key)
            self.assertEqual([(a["strategy"], a["feasible"], a["iteration_time_s"], a["reason"]) for a in doc["alternatives"]],
                             [(a["strategy"], a["feasible"], a["iteration_time_s"], a["reason"]) for a in p.alternatives])

    def test_distmm(self):
        with braid.plan(self.config, strategy="distmm") as p:
            self.assertEqual(p.strategy, "distmm")
            modules = by_name(p.modules)
            self.assertEqual(modules["text_encoder"]["tp"], 1)
            self.assertLess(modules["text_encoder"]["devices"], modules["image_encoder"]["devices"])
            self.assertLessEqual(modules["text_encoder"]["devices"] + modules["image_encoder"]["devices"], 64)

    def test_yaml_round_trip_with_fixed(self):
        with braid.plan(self.config) as p:
            text = p.to_yaml()
            self.assertIsInstance(text, str)
            self.assertIn("modules:", text)
            with braid.plan(self.config, strategy="fixed", plan_yaml=text) as fixed:
                self.assertEqual(fixed.strategy, "fixed")
                self.assertEqual(fixed.estimate["iteration_time_s"], p.estimate["iteration_time_s"])
                self.assertEqual(fixed.modules, p.modules)

    def test_megatron_constraints(self):
        with braid.Config.from_file(VIT22B) as config, braid.plan(config, "megatron", tp=8, pp=8) as p:
            self.assertEqual(p.strategy, "megatron")
            for m in p.modules:
                self.assertEqual(m["tp"], 8, m["name"])

    def test_bad_arguments(self):
        with self.assertRaises(braid.BraidError) as cm:
            braid.plan(self.config, strategy="megatorn")
        self.assertEqual(cm.exception.status, 1)
        self.assertIn("megatron", str(cm.exception))
        with self.assertRaises(braid.InvalidArgumentError) as cm:
            braid.plan(self.config, tp=-1)
        self.assertIn("tp", str(cm.exception))
        with self.assertRaises(braid.InvalidArgumentError) as cm:
            braid.plan(self.config, strategy="fixed")
        self.assertIn("plan_yaml", str(cm.exception))
        with self.assertRaises(braid.InvalidArgumentError):
            braid.plan(self.config, plan_yaml="strategy: megatron\n")
        with self.assertRaises(braid.InvalidArgumentError):
            braid.plan("not a config")

    def test_bad_fixed_plan(self):
        with self.assertRaises(braid.BraidError) as cm:
            braid.plan(self.config, strategy="fixed", plan_yaml="strategy: megatron\nmodules: 3\n")
        self.assertEqual(cm.exception.status, 2)
        self.assertIn("<plan_yaml>", str(cm.exception))

    def test_not_applicable_strategy(self):
        with self.assertRaises(braid.BraidError) as cm:
            braid.plan(self.config, strategy="disttrain")
        self.assertEqual(cm.exception.status, 5)
        self.assertIsInstance(cm.exception, braid.UnsupportedError)
        self.assertIn("disttrain", str(cm.exception))


class ErrorTest(unittest.TestCase):
    def test_bad_yaml_string(self):
        with self.assertRaises(braid.BraidError) as cm:
            braid.Config.from_string(CLIP_WITH_TYPO, base_dir=os.path.dirname(CLIP))
        e = cm.exception
        self.assertEqual(e.status, 2)
        self.assertIsInstance(e, braid.BadConfigError)
        self.assertIn("<string>:", str(e))
        self.assertIn("microbtach", str(e))
        self.assertIn("microbatch", str(e))

    def test_malformed_yaml_string(self):
        with self.assertRaises(braid.BadConfigError) as cm:
            braid.Config.from_string("name: [unclosed\n")
        self.assertIn("<string>:", str(cm.exception))

    def test_good_yaml_string(self):
        with open(CLIP) as f:
            text = f.read()
        with braid.Config.from_string(text, base_dir=os.path.dirname(CLIP)) as config:
            self.assertEqual(config.devices, 64)

    def test_missing_file(self):
        path = os.path.join(tempfile.gettempdir(), "braid-no-such-dir", "run.yaml")
        with self.assertRaises(braid.BraidError) as cm:
            braid.Config.from_file(path)
        self.assertIn(cm.exception.status, (2, 4))
        self.assertIn(path, str(cm.exception))

    def test_infeasible(self):
        with braid.Config.from_string(GPT175B_ON_ONE_NODE, base_dir=SOURCE_DIR) as config:
            self.assertEqual(config.devices, 8)
            with self.assertRaises(braid.BraidError) as cm:
                braid.plan(config)
        e = cm.exception
        self.assertEqual(e.status, 3)
        self.assertIsInstance(e, braid.InfeasibleError)
        self.assertIn("it fits from", str(e))


class LifetimeTest(unittest.TestCase):
    def test_close_is_idempotent_and_blocks_use(self):
        config = braid.Config.from_file(CLIP)
        p = braid.plan(config)
        p.close()
        p.close()
        self.assertTrue(p.closed)
        with self.assertRaises(braid.InvalidArgumentError):
            p.estimate
        config.close()
        config.close()
        self.assertTrue(config.closed)
        with self.assertRaises(braid.InvalidArgumentError):
            config.devices
        with self.assertRaises(braid.InvalidArgumentError):
            braid.plan(config)

    def test_plan_keeps_config_alive(self):
        config = braid.Config.from_file(CLIP)
        p = braid.plan(config)
        expected = p.estimate
        config.close()  # deferred: the plan still points into it
        del config
        gc.collect()
        self.assertEqual(p.estimate, expected)
        self.assertEqual(p.to_json()["estimate"]["iteration_time_s"], expected["iteration_time_s"])
        self.assertTrue(p.config.closed)
        p.close()
        self.assertFalse(p.config._handle)  # freed with its last plan

    def test_del_frees(self):
        for _ in range(20):
            p = braid.plan(braid.Config.from_file(CLIP), "megatron")
            self.assertEqual(p.strategy, "megatron")
            del p
        gc.collect()


def llava_config():
    return braid.Config.from_string(LLAVA_32GPU, base_dir=os.path.dirname(CLIP))


def ops(stage, *names):
    return [i for i in stage["instructions"] if i["op"] in names]


class ProgramTest(unittest.TestCase):
    """The program of LLaVA-13B on 32 devices, megatron tp=8 pp=4 (dp=1, 32 microbatches)."""

    @classmethod
    def setUpClass(cls):
        cls.config = llava_config()
        cls.plan = braid.plan(cls.config, "megatron", tp=8, pp=4)
        cls.program = cls.plan.program()
        cls.stages = cls.program.stages

    @classmethod
    def tearDownClass(cls):
        cls.program.close()
        cls.plan.close()
        cls.config.close()

    def test_one_f_one_b_structure(self):
        self.assertEqual(self.program.schedule, "1f1b")
        stages = self.stages
        self.assertEqual(len(stages), 4)
        keys = {"name", "module", "replicas", "devices_per_replica", "first_device", "device_stride", "depth", "prev",
                "next", "instructions"}
        for s, stage in enumerate(stages):
            self.assertEqual(set(stage), keys)
            self.assertEqual(stage["depth"], s)
            self.assertEqual(stage["replicas"], 1)
            self.assertEqual(stage["devices_per_replica"], 8)
            self.assertEqual(stage["prev"], [s - 1] if s > 0 else [])
            self.assertEqual(stage["next"], [s + 1] if s < 3 else [])
            forwards, backwards = ops(stage, "FORWARD"), ops(stage, "BACKWARD")
            self.assertEqual([i["microbatch"] for i in forwards], list(range(32)))
            self.assertEqual([i["microbatch"] for i in backwards], list(range(32)))
            for i in stage["instructions"]:
                self.assertIn(i["op"], braid.OPCODES)
                self.assertEqual(set(i), {"op", "microbatch", "chunk", "peer", "group", "unit", "flags"})
                if i["op"] == "SEND_ACTIVATION":
                    self.assertEqual(i["peer"], s + 1)
                if i["op"] in ("RECV_ACTIVATION", "SEND_GRAD"):
                    self.assertEqual(i["peer"], s - 1)
                if i["op"] == "RECV_GRAD":
                    self.assertEqual(i["peer"], s + 1)
            # Megatron 1F1B: p-s-1 warm-up forwards, then one forward per backward.
            compute = [i["op"] for i in ops(stage, "FORWARD", "BACKWARD")]
            self.assertEqual(compute.index("BACKWARD"), (4 - s - 1) + 1, stage["name"])
        self.assertEqual(stages[0]["prev"], [])
        self.assertEqual(stages[0]["next"], [1])
        self.assertEqual(len(ops(stages[0], "LOAD_MICROBATCH")), 32)
        self.assertIn("stage 3", stages[3]["name"])
        first, second = ops(stages[3], "FORWARD", "BACKWARD")[:2]
        self.assertEqual((first["op"], first["microbatch"]), ("FORWARD", 0))
        self.assertEqual((second["op"], second["microbatch"]), ("BACKWARD", 0))

    def test_schedules_by_name(self):
        for name in ("", "1f1b", "gpipe"):
            with self.subTest(schedule=name), self.plan.program(name) as program:
                self.assertEqual(program.schedule, name or "1f1b")
        with self.plan.program("gpipe") as gpipe:
            compute = [i["op"] for i in ops(gpipe.stages[0], "FORWARD", "BACKWARD")]
            self.assertEqual(compute, ["FORWARD"] * 32 + ["BACKWARD"] * 32)

    def test_unsupported_schedule(self):
        with self.assertRaises(braid.UnsupportedError) as cm:
            self.plan.program("zigzag")
        self.assertEqual(cm.exception.status, braid.ERR_UNSUPPORTED)
        self.assertIn("zigzag", str(cm.exception))
        self.assertIn("1f1b", str(cm.exception))
        self.assertIn("gpipe", str(cm.exception))
        with self.assertRaises(braid.UnsupportedError):
            self.plan.program("distmm-pipe")  # not contrastive
        with self.assertRaises(braid.InvalidArgumentError):
            self.plan.program(42)

    def test_simulation(self):
        with self.program.simulate(trace=True, trace_replicas=1) as sim:
            r = sim.result
            self.assertEqual(set(r), {"step_time_s", "bubble_fraction", "bubbles", "peak_memory_gib", "mfu", "devices",
                                      "ranks", "events"})
            self.assertEqual(tuple(r["bubbles"]), braid.BUBBLE_CAUSES)
            self.assertEqual(set(r["bubbles"]), {"dp_start", "dp_end", "dp_shard", "pp_warmup", "pp_cooldown",
                                                 "pp_other", "tp", "batch_sync", "imbalance"})
            self.assertGreater(r["step_time_s"], 0)
            self.assertGreaterEqual(r["bubble_fraction"], 0)
            self.assertLess(r["bubble_fraction"], 1)
            self.assertGreater(r["bubbles"]["pp_warmup"], 0)
            self.assertEqual(r["bubbles"]["batch_sync"], 0)
            self.assertTrue(all(v >= 0 for v in r["bubbles"].values()))
            self.assertEqual(r["devices"], 32)
            self.assertEqual(r["ranks"], 4)
            self.assertGreater(r["events"], 0)
            self.assertTrue(0 < r["mfu"] < 1)
            self.assertGreater(r["peak_memory_gib"], 0)

            stages = sim.stages
            self.assertEqual([st["name"] for st in stages], [st["name"] for st in self.stages])
            for st in stages:
                self.assertEqual(set(st), {"name", "busy_s", "idle_s", "bubbles", "peak_memory_gib", "finish_s"})
                self.assertGreater(st["busy_s"], 0)
                self.assertGreaterEqual(st["idle_s"], 0)
                self.assertLessEqual(st["finish_s"], r["step_time_s"] * (1 + 1e-9))
                self.assertEqual(tuple(st["bubbles"]), braid.BUBBLE_CAUSES)
                # busy + idle covers the step on every device
                self.assertAlmostEqual(st["busy_s"] + st["idle_s"], r["step_time_s"], delta=1e-6 * r["step_time_s"])
            self.assertAlmostEqual(max(st["peak_memory_gib"] for st in stages), r["peak_memory_gib"])

            gantt = sim.gantt()
            self.assertIn("stage 3", gantt)
            self.assertIn("stage 0", sim.gantt(width=40))
            with self.assertRaises(braid.InvalidArgumentError):
                sim.gantt(width=-1)

    def test_trace_file_is_json(self):
        with self.program.simulate(trace=True) as sim, tempfile.TemporaryDirectory(prefix="braid-py-") as d:
            path = os.path.join(d, "trace.json")
            sim.write_trace(path)
            with open(path) as f:
                doc = json.load(f)
            self.assertIn("traceEvents", doc)
            events = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
            self.assertTrue(events)
            self.assertTrue(any(e["args"]["op"] == "FORWARD" or "forward" in e["name"] for e in events))
            with self.assertRaises(braid.BraidIOError):
                sim.write_trace(os.path.join(d, "no-such-dir", "trace.json"))

    def test_no_trace_without_record(self):
        with self.program.simulate() as sim:
            self.assertGreater(sim.result["step_time_s"], 0)
            with self.assertRaises(braid.InvalidArgumentError) as cm:
                sim.gantt()
            self.assertIn("record_trace", str(cm.exception))
            with self.assertRaises(braid.InvalidArgumentError):
                sim.write_trace(os.path.join(tempfile.gettempdir(), "braid-never-written.json"))

    def test_bad_simulation_options(self):
        with self.assertRaises(braid.InvalidArgumentError):
            self.program.simulate(trace_replicas=-2)
        with self.assertRaises(braid.InvalidArgumentError):
            self.program.simulate(trace_replicas=2**40)

    def test_same_step_as_plan_report(self):
        # The plan's JSON reports the simulated step of its default program.
        simulated = self.plan.to_json()["estimate"]["simulated_iteration_time_s"]
        with self.program.simulate() as sim:
            self.assertAlmostEqual(sim.result["step_time_s"], simulated, delta=1e-9 * simulated)


class DistmmProgramTest(unittest.TestCase):
    def test_distmm_pipe_batch_sync(self):
        with braid.Config.from_file(CLIP) as config, braid.plan(config, "distmm") as p, \
                p.program("distmm-pipe") as program:
            self.assertEqual(program.schedule, "distmm-pipe")
            last = [st for st in program.stages if not st["next"]]
            self.assertEqual(len(last), 2)  # image and text encoder
            for st in last:
                syncs = ops(st, "BATCH_SYNC")
                groups = [i["group"] for i in syncs]
                self.assertTrue(groups)
                self.assertEqual(sorted(groups), list(range(len(groups))), st["name"])
                ins = st["instructions"]
                first_backward = next(k for k, i in enumerate(ins) if i["op"] == "BACKWARD")
                self.assertLess(ins.index(syncs[0]), first_backward)
            with program.simulate() as sim:
                self.assertGreater(sim.result["bubbles"]["batch_sync"], 0)


class ProgramLifetimeTest(unittest.TestCase):
    def test_program_outlives_plan_and_config(self):
        config = llava_config()
        p = braid.plan(config, "megatron", tp=8, pp=4)
        program = p.program()
        p.close()
        config.close()
        del p, config
        gc.collect()
        self.assertEqual(len(program.stages), 4)
        with program.simulate() as sim:
            self.assertGreater(sim.result["step_time_s"], 0)
        program.close()

    def test_simulation_keeps_program_alive(self):
        with llava_config() as config, braid.plan(config, "megatron", tp=8, pp=4) as p:
            program = p.program()
            sim = program.simulate(trace=True)
            program.close()  # deferred: the simulation points into it
            self.assertTrue(program.closed)
            with self.assertRaises(braid.InvalidArgumentError):
                program.stages
            with self.assertRaises(braid.InvalidArgumentError):
                program.simulate()
            self.assertEqual(len(sim.stages), 4)
            self.assertIn("stage 3", sim.gantt())
            self.assertTrue(program._handle)
            sim.close()
            sim.close()
            self.assertTrue(sim.closed)
            self.assertFalse(program._handle)  # freed with its last simulation
            with self.assertRaises(braid.InvalidArgumentError):
                sim.result

    def test_closed_plan_makes_no_program(self):
        with llava_config() as config:
            p = braid.plan(config, "megatron", tp=8, pp=4)
            p.close()
            with self.assertRaises(braid.InvalidArgumentError):
                p.program()

    def test_del_frees(self):
        with llava_config() as config, braid.plan(config, "megatron", tp=8, pp=4) as p:
            for _ in range(10):
                sim = p.program().simulate(trace=True)
                self.assertIn("stage 3", sim.gantt())
                del sim
            gc.collect()


class ReorderTest(unittest.TestCase):
    """Data reordering for a host data loader: a skewed LLaVA batch on its disttrain plan."""

    TEXT = [1472 if i % 8 == 0 else 64 + 32 * (i % 5) for i in range(32)]
    IMAGE = [224 + 14 * ((i * 7) % 17) for i in range(32)]

    def test_assignment_has_equal_counts_whole_microbatches_and_is_deterministic(self):
        with llava_config() as config, braid.plan(config, "disttrain") as p:
            batch = p.reorder(text_tokens=self.TEXT, image_resolution=self.IMAGE)
            self.assertEqual(batch, p.reorder(text_tokens=self.TEXT, image_resolution=self.IMAGE))
            self.assertEqual(batch["samples"], 32)
            self.assertLess(batch["straggler_after"], batch["straggler_before"])
            self.assertGreater(batch["evaluations"], 0)
            for module in p.modules:
                ranks = batch["ranks"][module["name"]]
                counts = [ranks.count(r) for r in range(module["dp"])]
                self.assertEqual(counts, [32 // module["dp"]] * module["dp"], module["name"])
            m = batch["microbatches_per_pipeline"]
            slots = list(zip(batch["cells"], batch["microbatches"]))
            for slot in set(slots):
                self.assertEqual(slots.count(slot), batch["cell_microbatch"])
            self.assertEqual(len(batch["orders"]), batch["pipeline_groups"])
            for order in batch["orders"]:
                self.assertEqual(sorted(order), list(range(m)))

    def test_no_reordering_keeps_dataset_order(self):
        with llava_config() as config, braid.plan(config, "disttrain") as p:
            batch = p.reorder(text_tokens=self.TEXT, reordering="none")
            self.assertEqual(batch["straggler_after"], batch["straggler_before"])
            self.assertEqual(batch["cells"], sorted(batch["cells"]))
            for order in batch["orders"]:
                self.assertEqual(order, sorted(order))

    def test_module_costs_directly(self):
        with llava_config() as config, braid.plan(config, "disttrain") as p:
            costs = [[t * (k + 1) for k in range(len(p.modules))] for t in self.TEXT]
            batch = p.reorder(module_costs=costs, reordering="intra")
            self.assertLess(batch["straggler_after"], batch["straggler_before"])
            with self.assertRaises(braid.InvalidArgumentError) as e:
                p.reorder(module_costs=[[1.0]] * 32)
            self.assertIn("the plan has", str(e.exception))

    def test_bad_batches_say_why(self):
        with llava_config() as config, braid.plan(config, "disttrain") as p:
            with self.assertRaises(braid.InvalidArgumentError) as e:
                p.reorder(text_tokens=self.TEXT[:31])
            self.assertIn("a batch of 31 samples does not split into", str(e.exception))
            with self.assertRaises(braid.InvalidArgumentError) as e:
                p.reorder(text_tokens=self.TEXT, image_resolution=self.IMAGE[:30])
            self.assertIn("differ in length", str(e.exception))
            with self.assertRaises(braid.InvalidArgumentError) as e:
                p.reorder(text_tokens=self.TEXT, reordering="intra-inter")
            self.assertIn("did you mean 'intra_inter'?", str(e.exception))
            with self.assertRaises(braid.InvalidArgumentError) as e:
                p.reorder(text_tokens=[0] * 32)
            self.assertIn("text_tokens of sample 0 is 0", str(e.exception))


def most_encoder_tasks(program):
    return max(len(ops(stage, "ENCODER_TASK")) for stage in program.stages)


class BubbleSchedulerTest(unittest.TestCase):
    """The Optimus bubble scheduler on the colocated plan of MLLM-72B (1024 devices)."""

    @classmethod
    def setUpClass(cls):
        cls.config = braid.Config.from_file(MLLM)
        cls.plan = braid.plan(cls.config, "optimus")
        cls.scheduler = cls.plan.bubble_scheduler()
        cls.report = cls.scheduler.run()

    @classmethod
    def tearDownClass(cls):
        cls.scheduler.close()
        cls.plan.close()
        cls.config.close()

    def test_report(self):
        r = self.report
        self.assertEqual(set(r), {"plain_step_s", "coarse_step_s", "fine_step_s", "recovered_coarse", "recovered_fine",
                                  "bubbles_before", "bubbles_after", "scheduler_time_s", "placements", "encoder_tasks",
                                  "tp_bubble_tasks"})
        self.assertGreater(r["plain_step_s"], 0)
        self.assertLessEqual(r["fine_step_s"], r["coarse_step_s"])
        self.assertLessEqual(r["coarse_step_s"], r["plain_step_s"])
        self.assertTrue(0 <= r["recovered_coarse"] <= r["recovered_fine"] <= 1, r)
        for key in ("bubbles_before", "bubbles_after"):
            self.assertEqual(tuple(r[key]), braid.BUBBLE_CAUSES)
            self.assertTrue(all(v >= 0 for v in r[key].values()))
        # The recovered share is the idle time the fine schedule took from encoder-first.
        before, after = sum(r["bubbles_before"].values()), sum(r["bubbles_after"].values())
        self.assertAlmostEqual(r["recovered_fine"], (before - after) / before, delta=1e-9)
        self.assertGreater(r["encoder_tasks"], 0)
        self.assertGreaterEqual(r["placements"], 3)
        self.assertEqual(self.scheduler.run(), r)  # idempotent
        self.assertEqual(self.scheduler.report, r)

    def test_programs(self):
        for name in braid.BUBBLE_SCHEDULES + (None, ""):
            with self.subTest(schedule=name), self.scheduler.program(name) as program:
                self.assertEqual(program.schedule, name or "optimus-fine")
                # Each encoder task once per microbatch: the busiest stage holds the report's count.
                self.assertEqual(most_encoder_tasks(program), self.report["encoder_tasks"])

    def test_fine_program_is_the_plans_and_simulates_to_the_report(self):
        with self.scheduler.program() as fine, self.plan.program("optimus-fine") as reference:
            self.assertEqual(fine.stages, reference.stages)
            with fine.simulate() as sim:
                step = sim.result["step_time_s"]
        self.assertAlmostEqual(step, self.report["fine_step_s"], delta=1e-9 * step)

    def test_bad_schedule(self):
        with self.assertRaises(braid.InvalidArgumentError) as e:
            self.scheduler.program("1f1b")
        self.assertIn("'1f1b'", str(e.exception))
        self.assertIn("optimus-coarse", str(e.exception))
        with self.assertRaises(braid.InvalidArgumentError):
            self.scheduler.program(3)

    def test_nothing_to_read_before_run(self):
        with self.plan.bubble_scheduler() as scheduler:
            with self.assertRaises(braid.InvalidArgumentError) as e:
                scheduler.report
            self.assertIn("has not run yet", str(e.exception))
            with self.assertRaises(braid.InvalidArgumentError):
                scheduler.program()
        with self.assertRaises(braid.InvalidArgumentError):
            scheduler.run()  # closed

    def test_plan_that_is_not_colocated(self):
        with llava_config() as config, braid.plan(config, "megatron", tp=8, pp=4) as p:
            with self.assertRaises(braid.UnsupportedError) as e:
                p.bubble_scheduler()
            self.assertIn("colocated", str(e.exception))
            self.assertIn("monolithic", str(e.exception))
            self.assertEqual(p.config._dependents, 1)  # only the plan: the failed call let go

    def test_scheduler_outlives_plan_and_keeps_config(self):
        config = braid.Config.from_file(MLLM)
        p = braid.plan(config, "optimus")
        scheduler = p.bubble_scheduler()
        p.close()
        config.close()  # deferred: the scheduler uses its cost model
        self.assertTrue(config._handle)
        self.assertEqual(scheduler.run()["fine_step_s"], self.report["fine_step_s"])
        scheduler.close()
        self.assertFalse(config._handle)  # freed with the scheduler


if __name__ == "__main__":
    unittest.main()
