"""The binding's planning, program, simulation, reordering and bubble-scheduling calls
against the real libbraid.so: results are typed records whose fields equal the plan's
own JSON, programs have the structure their schedule promises, simulations add up,
reorderings keep equal counts, the bubble scheduler never ends slower, misuse raises
the exception of its status with the library's message, and handles live as long as
something points into them.

Environment: BRAID_LIBRARY (the libbraid.so to test; required), BRAID_SOURCE_DIR (the
repository, for configs/; default: two directories up). Run with
`python3 -m unittest discover -s tests/python -p test_binding.py -v` or with pytest.
"""

import dataclasses
import gc
import json
import os
import tempfile
import unittest

from _support import CLIP, MLLM, SOURCE_DIR, VIT22B, braid, by_name, llava_config, ops
from _support import require_library as setUpModule  # noqa: F401

GPT175B_ON_ONE_NODE = """\
name: gpt-175b-one-node
model: configs/models/gpt-175b.yaml
cluster: configs/clusters/dgx-a100-80gb.yaml
nodes: 1
training: {global_batch: 64, microbatch: 1, recompute: full}
data: {text: {tokens: 2048}}
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
            self.assertIn(p.strategy, braid.vocab.strategies())
            alts = p.alternatives
            self.assertIsInstance(alts, tuple)
            self.assertEqual(len(alts), 4)
            self.assertEqual(alts[0].reason, "fastest")
            self.assertIs(alts[0].feasible, True)
            self.assertEqual(alts[0].strategy, p.strategy)
            self.assertEqual({a.strategy for a in alts}, {"megatron", "distmm", "disttrain", "optimus"})
            for a in alts:
                self.assertIsInstance(a, braid.records.Alternative)
                self.assertTrue(a.reason)
                if a.feasible:
                    self.assertGreaterEqual(a.iteration_time_s, alts[0].iteration_time_s)
                else:
                    self.assertEqual(a.iteration_time_s, 0)  # braid.h: 0 when not feasible

            est = p.estimate
            self.assertIsInstance(est, braid.records.Estimate)
            self.assertEqual(set(est._asdict()), {"iteration_time_s", "samples_per_s", "tflops_per_device", "mfu",
                                                  "peak_memory_gib", "bubble_fraction", "devices"})
            for key in ("iteration_time_s", "samples_per_s", "tflops_per_device", "mfu", "peak_memory_gib"):
                self.assertGreater(getattr(est, key), 0, key)
            self.assertLess(est.mfu, 1)
            self.assertGreaterEqual(est.bubble_fraction, 0)
            self.assertEqual(est.iteration_time_s, alts[0].iteration_time_s)
            self.assertTrue(0 < est.devices <= 64)
            with self.assertRaises(dataclasses.FrozenInstanceError):
                est.devices = 3

            modules = p.modules
            self.assertEqual(set(by_name(modules)), {"image_encoder", "text_encoder"})
            for m in modules:
                self.assertEqual(m.role, "encoder")
                self.assertGreaterEqual(m.first_device, 0)
                self.assertGreater(m.devices, 0)
                self.assertLessEqual(m.first_device + m.devices, 64)
                self.assertEqual(m.tp * m.pp * m.dp, m.devices)
                self.assertIsInstance(m.layers_per_stage, tuple)
                self.assertEqual(len(m.layers_per_stage), m.pp)
                self.assertGreater(m.microbatch_size, 0)

    def test_record_fields_match_json(self):
        with braid.plan(self.config) as p:
            doc = p.to_json()
            self.assertEqual(doc["strategy"], p.strategy)
            self.assertEqual(doc["devices"], p.estimate.devices)
            for key, value in p.estimate._asdict().items():
                if key != "devices":
                    self.assertEqual(doc["estimate"][key], value, key)
            self.assertEqual(len(doc["modules"]), len(p.modules))
            for from_json, record in zip(doc["modules"], p.modules):
                for key, value in record._asdict().items():
                    self.assertEqual(from_json[key], value, key)
            self.assertEqual(
                [(a["strategy"], a["feasible"], a["iteration_time_s"] or 0, a["reason"]) for a in doc["alternatives"]],
                [(a.strategy, a.feasible, a.iteration_time_s, a.reason) for a in p.alternatives])
            json.dumps([m._asdict() for m in p.modules])  # plain values

    def test_distmm(self):
        with self.config.plan(strategy="distmm") as p:
            self.assertEqual(p.strategy, "distmm")
            modules = by_name(p.modules)
            self.assertEqual(modules["text_encoder"].tp, 1)
            self.assertLess(modules["text_encoder"].devices, modules["image_encoder"].devices)
            self.assertLessEqual(modules["text_encoder"].devices + modules["image_encoder"].devices, 64)

    def test_yaml_round_trip_with_fixed(self):
        with braid.plan(self.config) as p:
            text = p.to_yaml()
            self.assertIsInstance(text, str)
            self.assertIn("modules:", text)
            with braid.plan(self.config, strategy="fixed", plan_yaml=text) as fixed:
                self.assertEqual(fixed.strategy, "fixed")
                self.assertEqual(fixed.estimate.iteration_time_s, p.estimate.iteration_time_s)
                self.assertEqual(fixed.modules, p.modules)

    def test_megatron_constraints(self):
        with braid.Config.from_file(VIT22B) as config, braid.plan(config, "megatron", tp=8, pp=8) as p:
            self.assertEqual(p.strategy, "megatron")
            for m in p.modules:
                self.assertEqual(m.tp, 8, m.name)

    def test_strategy_by_value_and_case(self):
        with braid.plan(self.config, strategy=1) as p:  # BRAID_STRATEGY_MEGATRON
            self.assertEqual(p.strategy, "megatron")
        with braid.plan(self.config, strategy="DistMM") as p:
            self.assertEqual(p.strategy, "distmm")

    def test_bad_arguments(self):
        with self.assertRaises(braid.BraidError) as cm:
            braid.plan(self.config, strategy="megatorn")
        self.assertEqual(cm.exception.status, 1)
        self.assertIn("did you mean 'megatron'?", str(cm.exception))
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
        with self.assertRaises(braid.InvalidArgumentError):
            braid.plan(self.config, strategy=6)
        with self.assertRaises(braid.InvalidArgumentError):
            braid.plan(self.config, tp=2**31)
        # A NUL would end the C string early: the library would read another name or document.
        with self.assertRaises(braid.InvalidArgumentError) as cm:
            braid.plan(self.config, schedule="1f1b\0garbage")
        self.assertIn("schedule holds a NUL byte at offset 4", str(cm.exception))
        with self.assertRaises(braid.InvalidArgumentError):
            braid.plan(self.config, strategy="fixed", plan_yaml="layout: monolithic\0\nbogus: [\n")
        with self.assertRaises(braid.InvalidArgumentError):
            braid.plan(self.config, strategy="fixed", plan_yaml=5)
        with self.assertRaises(braid.InvalidArgumentError):
            braid.Config.from_file(CLIP + "\0.does-not-exist")

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


class PlanOptionsTest(unittest.TestCase):
    """braid_plan_options version 2: this plan's schedule, virtual stages and microbatch size."""

    def test_microbatch_size_override(self):
        with llava_config() as config:
            with config.plan("megatron", tp=8, pp=4) as base, \
                    config.plan("megatron", tp=8, pp=4, microbatch_size=2) as p:
                self.assertEqual({m.microbatch_size for m in base.modules}, {1})
                self.assertEqual({m.microbatch_size for m in p.modules}, {2})
                with base.program() as a, p.program() as b:
                    self.assertEqual(b.microbatches * 2, a.microbatches)

    def test_schedule_override(self):
        with llava_config() as config, config.plan("megatron", tp=8, pp=4, schedule="gpipe") as p, \
                p.program() as program:
            self.assertEqual(program.schedule, "gpipe")
            self.assertEqual(p.to_json()["schedule"], "gpipe", "the plan says what its programs run")
            compute = [i.opcode for i in ops(program.instructions(0), "Forward", "Backward")]
            self.assertEqual(compute, ["Forward"] * 32 + ["Backward"] * 32)

    def test_interleaved(self):
        with llava_config() as config, \
                config.plan("megatron", tp=8, pp=4, schedule="interleaved", virtual_stages=2) as p, \
                p.program() as program:
            self.assertEqual(program.schedule, "interleaved")
            self.assertEqual({i.chunk for i in ops(program.instructions(0), "Forward")}, {0, 1})

    def test_bad_overrides_say_why(self):
        with llava_config() as config:
            with self.assertRaises(braid.InvalidArgumentError) as cm:
                config.plan("megatron", schedule="1f1c")
            self.assertIn("1f1b", str(cm.exception))
            with self.assertRaises(braid.InvalidArgumentError):
                config.plan("megatron", microbatch_size=-1)
            with self.assertRaises(braid.InvalidArgumentError):
                config.plan("megatron", schedule=3)


class RunSettingsTest(unittest.TestCase):
    def test_read_matches_the_run_file(self):
        with llava_config() as config:
            s = config.run_settings
            self.assertIsInstance(s, braid.records.RunSettings)
            self.assertEqual((s.global_batch, s.microbatch_size, s.zero_stage), (32, 1, 1))
            self.assertEqual(s.recompute, "full")
            self.assertIn(s.precision, braid.vocab.precisions())
            self.assertIn(s.attention, braid.vocab.attentions())
            self.assertEqual((s.image_resolution, s.text_tokens, s.audio_tokens), (336, 1472, 0))
            self.assertIn(s.schedule, braid.vocab.schedules())
            self.assertIs(s.sequence_parallel, False)
            self.assertEqual((s.overlap_param_gather, s.tp_comm_overlap, s.fused_kernels, s.fp8),
                             (False, False, True, False))

    def test_set_changes_later_plans_only(self):
        with llava_config() as config, config.plan("megatron", tp=8, pp=4) as before:
            s = config.set_run_settings(microbatch_size=2, recompute="selective", precision="fp16")
            self.assertEqual((s.microbatch_size, s.recompute, s.precision), (2, "selective", "fp16"))
            self.assertEqual(config.run_settings, s)
            with config.plan("megatron", tp=8, pp=4) as after:
                self.assertEqual({m.microbatch_size for m in after.modules}, {2})
            self.assertEqual({m.microbatch_size for m in before.modules}, {1})

    def test_bad_settings_name_the_field_and_leave_the_config(self):
        with llava_config() as config:
            before = config.run_settings
            with self.assertRaises(braid.InvalidArgumentError) as cm:
                config.set_run_settings(microbatch_size=0)
            self.assertIn("microbatch_size", str(cm.exception))
            self.assertIn("training.microbatch", str(cm.exception))
            with self.assertRaises(braid.InvalidArgumentError) as cm:
                config.set_run_settings(microbatch=2)
            self.assertIn("did you mean 'microbatch_size'?", str(cm.exception))
            with self.assertRaises(braid.InvalidArgumentError) as cm:
                config.set_run_settings(recompute="ful")
            self.assertIn("full", str(cm.exception))
            with self.assertRaises(braid.InvalidArgumentError) as cm:
                config.set_run_settings(fp8=True)  # an A100 cluster
            self.assertIn("training.fp8", str(cm.exception))
            self.assertIn("gives no FP8 peak", str(cm.exception))
            with self.assertRaises(braid.InvalidArgumentError) as cm:  # was read as "gpipe"
                config.set_run_settings(schedule="gpipe\0bogus")
            self.assertIn("schedule holds a NUL byte at offset 5", str(cm.exception))
            self.assertEqual(config.run_settings, before)
            self.assertIs(config.set_run_settings(fused_kernels=False).fused_kernels, False)


class ErrorTest(unittest.TestCase):
    def test_arguments_of_another_kind_name_themselves(self):
        for call, fragment in [(lambda: braid.vocab.names("strategy"), "vocabulary must be an int"),
                               (lambda: braid.Groups(None), "Groups takes a braid.Plan, not NoneType"),
                               (lambda: braid.reorder.reorder(None, text_tokens=[1]),
                                "reorder takes a braid.Plan, not NoneType")]:
            with self.subTest(fragment=fragment), self.assertRaises(braid.InvalidArgumentError) as cm:
                call()
            self.assertIn(fragment, str(cm.exception))

    def test_errors_pickle_as_their_own_class(self):
        import pickle

        error = braid.LibraryNotFoundError(braid.ERR_IO, "no libbraid.so")
        again = pickle.loads(pickle.dumps(error))
        self.assertIs(type(again), braid.LibraryNotFoundError)  # was BraidIOError
        self.assertEqual((again.status, again.message), (error.status, error.message))

    def test_a_collection_inside_a_locked_section_does_not_deadlock(self):
        # A plan in a reference cycle is finalized by whatever collection comes next; when that
        # came while its config held its lock (building the "closed" error), Plan.close waited
        # on the same lock forever. The collection is forced there to make it certain.
        import gc
        from braid import _handles

        config = braid.Config.from_file(os.path.join(SOURCE_DIR, "configs/runs/tiny-clip.yaml"))
        was_enabled = gc.isenabled()
        gc.disable()
        original = _handles.invalid_argument
        try:
            plan = config.plan()
            plan.itself = plan
            del plan
            config.close()  # kept open by the plan until it is finalized
            _handles.invalid_argument = lambda message: (gc.collect(), original(message))[1]
            with self.assertRaises(braid.InvalidArgumentError):
                config.plan()
        finally:
            _handles.invalid_argument = original
            if was_enabled:
                gc.enable()
        self.assertTrue(config.closed)

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
        self.assertEqual(p.to_json()["estimate"]["iteration_time_s"], expected.iteration_time_s)
        self.assertTrue(p.config.closed)
        p.close()
        self.assertFalse(p.config._handle)  # freed with its last plan

    def test_del_frees(self):
        for _ in range(20):
            p = braid.plan(braid.Config.from_file(CLIP), "megatron")
            self.assertEqual(p.strategy, "megatron")
            del p
        gc.collect()


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
        self.assertEqual(self.program.microbatches, 32)
        stages = self.stages
        self.assertEqual(len(stages), 4)
        for s, stage in enumerate(stages):
            self.assertIsInstance(stage, braid.records.StageInfo)
            self.assertEqual(stage.depth, s)
            self.assertEqual(stage.replicas, 1)
            self.assertEqual(stage.devices_per_replica, 8)
            self.assertEqual(stage.gradient_scale, 1.0)
            self.assertEqual(stage.prev, (s - 1,) if s > 0 else ())
            self.assertEqual(stage.next, (s + 1,) if s < 3 else ())
            instructions = self.program.instructions(s)
            self.assertEqual(len(instructions), stage.instruction_count)
            forwards, backwards = ops(instructions, "Forward"), ops(instructions, "Backward")
            self.assertEqual([i.microbatch for i in forwards], list(range(32)))
            self.assertEqual([i.microbatch for i in backwards], list(range(32)))
            for i in instructions:
                self.assertIn(i.opcode, braid.vocab.opcodes())
                self.assertEqual(set(i._asdict()), {"opcode", "microbatch", "chunk", "peer", "group", "unit", "flags"})
                if i.opcode == "SendActivation":
                    self.assertEqual(i.peer, s + 1)
                if i.opcode in ("RecvActivation", "SendGrad"):
                    self.assertEqual(i.peer, s - 1)
                if i.opcode == "RecvGrad":
                    self.assertEqual(i.peer, s + 1)
            # Megatron 1F1B: p-s-1 warm-up forwards, then one forward per backward.
            compute = [i.opcode for i in ops(instructions, "Forward", "Backward")]
            self.assertEqual(compute.index("Backward"), (4 - s - 1) + 1, stage.name)
        self.assertEqual(len(ops(self.program.instructions(0), "LoadMicrobatch")), 32)
        self.assertIn("stage 3", stages[3].name)
        first, second = ops(self.program.instructions(3), "Forward", "Backward")[:2]
        self.assertEqual((first.opcode, first.microbatch), ("Forward", 0))
        self.assertEqual((second.opcode, second.microbatch), ("Backward", 0))

    def test_parts_cover_every_llm_layer_once(self):
        # A monolithic plan: the encoder's layers on the first stage, the llm's split evenly.
        layers = {}
        for stage in self.stages:
            self.assertGreaterEqual(len(stage.parts), 1)
            for part in stage.parts:
                self.assertIsInstance(part, braid.records.StagePart)
                layers.setdefault(part.module, []).append((part.first_layer, part.layer_count))
        for module, ranges in layers.items():
            info = self.plan.modules[module]
            self.assertEqual(sum(n for _, n in ranges), sum(info.layers_per_stage), info.name)

    def test_rank_programs_are_their_stages(self):
        for rank in range(self.plan.estimate.devices):
            mine = self.program.rank(rank)
            self.assertIsInstance(mine, braid.records.RankProgram)
            stage = self.stages[mine.stage]
            self.assertEqual(stage.first_device + mine.replica * stage.device_stride + mine.tp_rank, rank)
            self.assertEqual(mine.instructions, self.program.instructions(mine.stage))
        with self.assertRaises(braid.InvalidArgumentError) as cm:
            self.program.rank(32)
        self.assertIn("32", str(cm.exception))

    def test_schedules_by_name(self):
        for name in ("", "1f1b", "gpipe"):
            with self.subTest(schedule=name), self.plan.program(name) as program:
                self.assertEqual(program.schedule, name or "1f1b")
        with self.plan.program("gpipe") as gpipe:
            compute = [i.opcode for i in ops(gpipe.instructions(0), "Forward", "Backward")]
            self.assertEqual(compute, ["Forward"] * 32 + ["Backward"] * 32)

    def test_unsupported_schedule(self):
        with self.assertRaises(braid.InvalidArgumentError) as cm:
            self.plan.program("zigzag")  # no schedule of that name
        self.assertIn("zigzag", str(cm.exception))
        self.assertIn("1f1b", str(cm.exception))
        with self.assertRaises(braid.UnsupportedError) as cm:
            self.plan.program("distmm-pipe")  # a schedule, not for this layout: not contrastive
        self.assertEqual(cm.exception.status, braid.ERR_UNSUPPORTED)
        self.assertIn("distmm-pipe", str(cm.exception))
        with self.assertRaises(braid.InvalidArgumentError):
            self.plan.program(42)
        with self.assertRaises(braid.InvalidArgumentError):
            self.program.instructions(4)

    def test_simulation(self):
        with self.program.simulate(trace=True, trace_replicas=1) as sim:
            r = sim.result
            self.assertIsInstance(r, braid.records.SimulationResult)
            bubbles = braid.vocab.by_cause(r.bubbles_s)
            self.assertEqual(tuple(bubbles), braid.vocab.bubble_causes())
            self.assertEqual(len(r.bubbles_s), len(braid.vocab.bubble_causes()))
            self.assertGreater(r.step_time_s, 0)
            self.assertGreaterEqual(r.bubble_fraction, 0)
            self.assertLess(r.bubble_fraction, 1)
            self.assertGreater(bubbles["pp_warmup"], 0)
            self.assertEqual(bubbles["batch_sync"], 0)
            self.assertTrue(all(v >= 0 for v in r.bubbles_s))
            self.assertEqual(r.devices, 32)
            self.assertEqual(r.ranks, 4)
            self.assertGreater(r.events, 0)
            self.assertTrue(0 < r.mfu < 1)
            self.assertGreater(r.peak_memory_gib, 0)

            stages = sim.stages
            self.assertEqual(len(stages), len(self.stages))
            for st in stages:
                self.assertIsInstance(st, braid.records.StageResult)
                self.assertGreater(st.busy_s, 0)
                self.assertGreaterEqual(st.idle_s, 0)
                self.assertLessEqual(st.finish_s, r.step_time_s * (1 + 1e-9))
                self.assertEqual(len(st.bubbles_s), len(braid.vocab.bubble_causes()))
                # busy + idle covers the step on every device
                self.assertAlmostEqual(st.busy_s + st.idle_s, r.step_time_s, delta=1e-6 * r.step_time_s)
            self.assertAlmostEqual(max(st.peak_memory_gib for st in stages), r.peak_memory_gib)

            gantt = sim.gantt()
            self.assertIn("stage 3", gantt)
            self.assertIn("stage 0", sim.gantt(width=40))
            with self.assertRaises(braid.InvalidArgumentError):
                sim.gantt(width=-1)

    def test_trace_file_names_opcodes_as_the_vocabulary(self):
        with self.program.simulate(trace=True) as sim, tempfile.TemporaryDirectory(prefix="braid-py-") as d:
            path = os.path.join(d, "trace.json")
            sim.write_trace(path)
            with open(path) as f:
                doc = json.load(f)
            self.assertIn("traceEvents", doc)
            events = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
            self.assertTrue(events)
            self.assertTrue({e["args"]["op"] for e in events if "op" in e.get("args", {})} <=
                            set(braid.vocab.opcodes()))
            self.assertTrue(any(e["args"].get("op") == "Forward" for e in events))
            with self.assertRaises(braid.BraidIOError):
                sim.write_trace(os.path.join(d, "no-such-dir", "trace.json"))

    def test_no_trace_without_record(self):
        with self.program.simulate() as sim:
            self.assertGreater(sim.result.step_time_s, 0)
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
            self.assertAlmostEqual(sim.result.step_time_s, simulated, delta=1e-9 * simulated)


class DistmmProgramTest(unittest.TestCase):
    def test_distmm_pipe_batch_sync(self):
        with braid.Config.from_file(CLIP) as config, braid.plan(config, "distmm") as p, \
                p.program("distmm-pipe") as program:
            self.assertEqual(program.schedule, "distmm-pipe")
            stages = program.stages
            last = [s for s, st in enumerate(stages) if not st.next]
            self.assertEqual(len(last), 2)  # image and text encoder
            for s in last:
                ins = program.instructions(s)
                syncs = ops(ins, "BatchSync")
                groups = [i.group for i in syncs]
                self.assertTrue(groups)
                self.assertEqual(sorted(groups), list(range(len(groups))), stages[s].name)
                first_backward = next(k for k, i in enumerate(ins) if i.opcode == "Backward")
                self.assertLess(ins.index(syncs[0]), first_backward)
            # Every layer of every module appears exactly once over a disaggregated program.
            for m, module in enumerate(p.modules):
                parts = [part for st in stages for part in st.parts if part.module == m]
                self.assertEqual(sorted((x.first_layer, x.layer_count) for x in parts),
                                 [(sum(module.layers_per_stage[:k]), n) for k, n in enumerate(module.layers_per_stage)])
            with program.simulate() as sim:
                self.assertGreater(braid.vocab.by_cause(sim.result.bubbles_s)["batch_sync"], 0)


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
            self.assertGreater(sim.result.step_time_s, 0)
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
            self.assertIsInstance(batch, braid.records.ReorderedBatch)
            self.assertEqual(batch, p.reorder(text_tokens=self.TEXT, image_resolution=self.IMAGE))
            info = batch.info
            self.assertEqual(info.samples, 32)
            self.assertLess(info.straggler_after, info.straggler_before)
            self.assertGreater(info.evaluations, 0)
            for module in p.modules:
                ranks = batch.ranks[module.name]
                counts = [ranks.count(r) for r in range(module.dp)]
                self.assertEqual(counts, [32 // module.dp] * module.dp, module.name)
            slots = list(zip(batch.cells, batch.microbatches))
            for slot in set(slots):
                self.assertEqual(slots.count(slot), info.cell_microbatch)
            self.assertEqual(len(batch.orders), info.pipeline_groups)
            for order in batch.orders:
                self.assertEqual(sorted(order), list(range(info.microbatches)))
            json.dumps(batch._asdict())

    def test_no_reordering_keeps_dataset_order(self):
        with llava_config() as config, braid.plan(config, "disttrain") as p:
            batch = p.reorder(text_tokens=self.TEXT, reordering="none")
            self.assertEqual(batch.info.straggler_after, batch.info.straggler_before)
            self.assertEqual(list(batch.cells), sorted(batch.cells))
            for order in batch.orders:
                self.assertEqual(list(order), sorted(order))

    def test_module_costs_directly(self):
        with llava_config() as config, braid.plan(config, "disttrain") as p:
            costs = [[t * (k + 1) for k in range(len(p.modules))] for t in self.TEXT]
            batch = p.reorder(module_costs=costs, reordering="intra")
            self.assertLess(batch.info.straggler_after, batch.info.straggler_before)
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
    return max(len(ops(program.instructions(s), "EncoderTask")) for s in range(len(program.stages)))


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
        self.assertIsInstance(r, braid.records.BubbleReport)
        self.assertGreater(r.plain_step_s, 0)
        self.assertLessEqual(r.fine_step_s, r.coarse_step_s)
        self.assertLessEqual(r.coarse_step_s, r.plain_step_s)
        self.assertTrue(0 <= r.recovered_coarse <= r.recovered_fine <= 1, r)
        for values in (r.bubbles_before_s, r.bubbles_after_s):
            self.assertEqual(len(values), len(braid.vocab.bubble_causes()))
            self.assertTrue(all(v >= 0 for v in values))
        # The recovered share is the idle time the fine schedule took from encoder-first.
        before, after = sum(r.bubbles_before_s), sum(r.bubbles_after_s)
        self.assertAlmostEqual(r.recovered_fine, (before - after) / before, delta=1e-9)
        self.assertGreater(r.encoder_tasks, 0)
        self.assertGreater(r.dp_wait_tasks, 0)
        self.assertGreaterEqual(r.placements, 3)
        # Optimus' metric against the llm alone, per schedule (encoder-first, coarse, fine).
        self.assertGreater(r.llm_step_s, 0)
        self.assertGreater(r.encoder_s, 0)
        for step, hidden, filled in zip((r.plain_step_s, r.coarse_step_s, r.fine_step_s), r.encoder_hidden,
                                        r.bubble_filled):
            h = max(0.0, r.encoder_s - (step - r.llm_step_s))
            self.assertAlmostEqual(hidden * r.encoder_s, h, delta=1e-9 * r.encoder_s)
            self.assertAlmostEqual(filled * r.llm_idle_s, h, delta=1e-9 * r.llm_idle_s)
        self.assertEqual(self.scheduler.run(), r)  # idempotent
        self.assertEqual(self.scheduler.report, r)

    def test_programs(self):
        schedules = braid.vocab.bubble_schedules()
        self.assertEqual(schedules[0], "optimus-fine")
        for name in schedules + (None, ""):
            with self.subTest(schedule=name), self.scheduler.program(name) as program:
                self.assertEqual(program.schedule, name or schedules[0])
                # Each encoder task once per microbatch: the busiest stage holds the report's count.
                self.assertEqual(most_encoder_tasks(program), self.report.encoder_tasks)

    def test_fine_program_is_the_plans_and_simulates_to_the_report(self):
        with self.scheduler.program() as fine, self.plan.program("optimus-fine") as reference:
            self.assertEqual(fine.stages, reference.stages)
            for s in range(len(fine.stages)):
                self.assertEqual(fine.instructions(s), reference.instructions(s))
            with fine.simulate() as sim:
                step = sim.result.step_time_s
        self.assertAlmostEqual(step, self.report.fine_step_s, delta=1e-9 * step)

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
        self.assertEqual(scheduler.run().fine_step_s, self.report.fine_step_s)
        scheduler.close()
        self.assertFalse(config._handle)  # freed with the scheduler


if __name__ == "__main__":
    unittest.main()
