"""braid.deepspeed's config checks, without a distributed run: the "braid" section of a
DeepSpeed config is validated as DeepSpeed validates its own sections (an unknown or
misspelled key refused by name, with the closest known key; a wrong type or value named
by its dotted key; "auto" never dropped silently), DeepSpeed's batch keys are checked
against the braid run (naming the key and both values), and the engine refuses a
DeepSpeed release other than the one it subclasses, naming both.

Environment: BRAID_LIBRARY (required), PYTHONPATH with integrations/python. DeepSpeed is
used as installed, else from BRAID_DEEPSPEED_PATH (folders to put on sys.path); without
either, the tests that need DeepSpeed skip and say why.
"""

import importlib
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import types
import unittest

SOURCE_DIR = os.path.abspath(
    os.environ.get("BRAID_SOURCE_DIR") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
try:
    import braid
except ImportError:  # not on PYTHONPATH: the package of this checkout
    sys.path.insert(0, os.path.join(SOURCE_DIR, "integrations", "python"))
    import braid

TINY_CLIP = os.path.join(SOURCE_DIR, "configs", "runs", "tiny-clip.yaml")


def find_deepspeed():
    """(the deepspeed module, "") or (None, why it is not there). An installed DeepSpeed
    is used as is; else the folders of BRAID_DEEPSPEED_PATH go on sys.path. On CPU,
    DS_ACCELERATOR=cpu (set here unless given)."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    path = os.environ.get("BRAID_DEEPSPEED_PATH", "")
    try:
        return importlib.import_module("deepspeed"), ""
    except ImportError as e:
        if not path:
            return None, (f"DeepSpeed is not installed ({e}) and BRAID_DEEPSPEED_PATH is not set "
                          "(.ci/run sets it when /opt/braid-thirdparty/deepspeed-0.14.5 exists)")
    for folder in reversed([p for p in path.split(os.pathsep) if p]):
        if folder not in sys.path:
            sys.path.insert(0, folder)
    try:
        return importlib.import_module("deepspeed"), ""
    except Exception as e:  # ImportError, or a dependency's failure
        return None, f"DeepSpeed from BRAID_DEEPSPEED_PATH={path} does not import: {type(e).__name__}: {e}"


def pydantic_reason():
    try:
        importlib.import_module("pydantic")
        return ""
    except ImportError as e:
        return f"pydantic is not importable ({e}); install python3-pydantic"


PYDANTIC_REASON = pydantic_reason()
if PYDANTIC_REASON:
    print(f"test_deepspeed_config: skipping the section tests: {PYDANTIC_REASON}", file=sys.stderr)
else:
    import braid.deepspeed as bd


def setUpModule():
    if not os.environ.get("BRAID_LIBRARY"):
        raise unittest.SkipTest("set BRAID_LIBRARY to build/capi/libbraid.so")


@unittest.skipIf(PYDANTIC_REASON, PYDANTIC_REASON)
class SectionTest(unittest.TestCase):
    def refused(self, section, *parts):
        with self.assertRaises(braid.BadConfigError) as cm:
            bd.parse_section(section)
        for part in parts:
            self.assertIn(part, str(cm.exception))
        return str(cm.exception)

    def test_typed_defaults(self):
        s = bd.parse_section({})
        self.assertEqual((s.enabled, s.run, s.strategy, s.schedule, s.reorder), (False, None, "auto", "auto", "none"))
        self.assertEqual((s.tp, s.pp, s.dp, s.plan), (0, 0, 0, None))
        self.assertIsNone(s.schedule_name)
        self.assertIs(bd.parse_section(None).enabled, False)

    def test_misspelled_key_is_refused_by_name(self):
        message = self.refused({"enabled": True, "run": "r.yaml", "stratgy": "distmm"}, '"braid.stratgy"',
                               "did you mean 'strategy'")
        self.assertIn("enabled, run, strategy, schedule, reorder", message)  # the keys there are
        self.refused({"reordr": "intra"}, '"braid.reordr"', "did you mean 'reorder'")
        self.refused({"no_such_thing": 1}, '"braid.no_such_thing"')

    def test_wrong_values_name_the_key(self):
        self.refused({"strategy": "distm"}, '"braid.strategy"', "'distm'", "did you mean 'distmm'")
        self.refused({"reorder": "intra-inter"}, '"braid.reorder"', "did you mean 'intra_inter'")
        self.refused({"schedule": "1fb1"}, '"braid.schedule"', "did you mean '1f1b'")
        self.refused({"enabled": "yes"}, '"braid.enabled"')
        self.refused({"tp": "2"}, '"braid.tp"')
        self.refused({"pp": -1}, '"braid.pp"', "-1")
        self.refused({"enabled": True}, '"braid.run"', "required")
        self.refused({"strategy": "fixed"}, '"braid.plan"', "required")
        self.refused({"strategy": "distmm", "plan": "p.yaml"}, '"braid.plan"', "fixed")
        self.refused(["enabled"], '"braid"', "list")

    def test_names_come_from_the_library(self):
        for name in braid.vocab.strategies():
            if name != "fixed":
                self.assertEqual(bd.parse_section({"strategy": name}).strategy, name)
        for name in braid.vocab.schedules() + braid.vocab.bubble_schedules():
            self.assertEqual(bd.parse_section({"schedule": name}).schedule_name, name)
        for name in braid.vocab.reorderings():
            self.assertEqual(bd.parse_section({"reorder": name}).reorder, name)

    def test_auto_is_never_dropped_silently(self):
        # DeepSpeed's own DeepSpeedConfigModel drops every "auto" and falls back to the
        # field's default; here "auto" means "braid chooses" where braid has a choice...
        self.assertEqual(bd.parse_section({"strategy": "auto", "schedule": "auto"}).strategy, "auto")
        # ...and is refused where it has none.
        self.refused({"reorder": "auto"}, '"braid.reorder"', "'auto'")
        self.refused({"tp": "auto"}, '"braid.tp"')

    def test_relative_run_is_relative_to_the_config_file(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "ds.json")
            with open(path, "w") as f:
                json.dump({"train_batch_size": 128, "braid": {"enabled": True, "run": "runs/r.yaml"}}, f)
            ds, base = bd.load_deepspeed_config(path)
            self.assertEqual(ds["train_batch_size"], 128)
            self.assertEqual(bd.parse_section(ds["braid"], base).run, os.path.join(tmp, "runs", "r.yaml"))
        self.assertEqual(bd.parse_section({"enabled": True, "run": "r.yaml"}).run, "r.yaml")  # dict: as given

    def test_initialize_refuses_a_misspelled_key_before_importing_deepspeed(self):
        config = {"train_batch_size": 128, "braid": {"enabled": True, "run": TINY_CLIP, "strategy": "distmm",
                                                     "schedul": "distmm-pipe"}}
        with self.assertRaises(braid.BadConfigError) as cm:
            bd.initialize(config=config, modules={})
        self.assertIn('"braid.schedul"', str(cm.exception))
        self.assertIn("did you mean 'schedule'", str(cm.exception))
        with self.assertRaises(braid.BadConfigError) as cm:
            bd.initialize(config={"braid": {"run": TINY_CLIP}}, modules={})
        self.assertIn('"braid.enabled"', str(cm.exception))


# A DistMM plan of tiny-clip with each tower on 2 replicas (fixed, so the figures below do
# not move with the planner's choice).
TOWERS_ON_TWO_REPLICAS = """layout: branches
modules:
  - {name: image_encoder, tp: 1, pp: 1, dp: 2, first_device: 0, microbatch_size: 16}
  - {name: text_encoder, tp: 1, pp: 1, dp: 2, first_device: 2, microbatch_size: 16}
"""


@unittest.skipIf(PYDANTIC_REASON, PYDANTIC_REASON)
class BatchKeysTest(unittest.TestCase):
    """tiny-clip: global batch 128, microbatch 16; a DistMM plan with each tower on 2
    replicas, so each runs 128 / (16 x 2) = 4 microbatches."""

    @classmethod
    def setUpClass(cls):
        cls.config = braid.Config.from_file(TINY_CLIP)
        cls.plan = cls.config.plan("fixed", plan_yaml=TOWERS_ON_TWO_REPLICAS)
        cls.batch = bd.run_batch(cls.config, cls.plan, TINY_CLIP)

    @classmethod
    def tearDownClass(cls):
        cls.plan.close()
        cls.config.close()

    def test_run_figures(self):
        self.assertEqual((self.batch.global_batch, self.batch.microbatch, self.batch.microbatches), (128, 16, 4))

    def test_absent_or_auto_keys_take_the_runs(self):
        want = {"train_batch_size": 128, "train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": 4}
        self.assertEqual(bd.check_batch_keys({}, self.batch), want)
        self.assertEqual(bd.check_batch_keys({k: "auto" for k in want}, self.batch), want)
        self.assertEqual(bd.check_batch_keys(want, self.batch), want)

    def test_a_mismatch_names_the_key_and_both_values(self):
        for key, wrong, braid_key, right in [("train_batch_size", 64, "training.global_batch", 128),
                                             ("train_micro_batch_size_per_gpu", 8, "training.microbatch", 16),
                                             ("gradient_accumulation_steps", 2, "microbatches", 4)]:
            with self.assertRaises(braid.BadConfigError) as cm:
                bd.check_batch_keys({key: wrong}, self.batch)
            message = str(cm.exception)
            for part in (f'"{key}" is {wrong}', braid_key, f"= {right}", TINY_CLIP):
                self.assertIn(part, message)
        with self.assertRaises(braid.BadConfigError) as cm:
            bd.check_batch_keys({"train_batch_size": "128"}, self.batch)
        self.assertIn('"train_batch_size"', str(cm.exception))

    def test_before_planning_the_microbatch_count_is_not_checked(self):
        unplanned = bd.RunBatch(128, 16, None, TINY_CLIP)
        self.assertEqual(bd.check_batch_keys({"gradient_accumulation_steps": 2}, unplanned),
                         {"train_batch_size": 128, "train_micro_batch_size_per_gpu": 16,
                          "gradient_accumulation_steps": 2})


DEEPSPEED, DEEPSPEED_REASON = find_deepspeed()
if DEEPSPEED is None:
    print(f"test_deepspeed_config: skipping the DeepSpeed version tests: {DEEPSPEED_REASON}", file=sys.stderr)


@unittest.skipIf(PYDANTIC_REASON, PYDANTIC_REASON)
class VersionTest(unittest.TestCase):
    def test_another_release_is_refused_naming_both(self):
        fake = types.ModuleType("deepspeed")
        fake.__version__ = "0.15.1"
        fake.__file__ = os.path.join(tempfile.gettempdir(), "nowhere", "deepspeed", "__init__.py")
        with self.assertRaises(bd.DeepSpeedVersionError) as cm:
            bd.check_deepspeed_version(fake)
        self.assertIn("0.14.5", str(cm.exception))
        self.assertIn("0.15.1", str(cm.exception))
        self.assertIsInstance(cm.exception, ImportError)
        fake.__version__ = "0.14.5+0a1b2c3"  # a local build of the pinned release
        self.assertEqual(bd.check_deepspeed_version(fake), "0.14.5+0a1b2c3")

    def test_a_source_tree_reads_its_version_txt(self):
        with tempfile.TemporaryDirectory() as tmp:
            os.makedirs(os.path.join(tmp, "deepspeed"))
            with open(os.path.join(tmp, "version.txt"), "w") as f:
                f.write("0.14.5\n")
            fake = types.ModuleType("deepspeed")
            fake.__version__ = "0.0.0"  # what an uninstalled tree reports outside its folder
            fake.__file__ = os.path.join(tmp, "deepspeed", "__init__.py")
            self.assertEqual(bd.deepspeed_version(fake), "0.14.5")

    @unittest.skipIf(DEEPSPEED is None, DEEPSPEED_REASON)
    def test_the_deepspeed_found_is_the_pinned_release(self):
        self.assertEqual(bd.DEEPSPEED_VERSION, "0.14.5")
        self.assertEqual(bd.check_deepspeed_version(DEEPSPEED).split("+")[0], "0.14.5")

    @unittest.skipIf(DEEPSPEED is None, DEEPSPEED_REASON)
    def test_deepspeed_features_the_engine_cannot_run_are_refused_by_name(self):
        from deepspeed.runtime.config import DeepSpeedConfig
        from braid.deepspeed.engine import _check_deepspeed_features

        base = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 8}
        _check_deepspeed_features(DeepSpeedConfig(dict(base, zero_optimization={"stage": 1})))  # runs
        _check_deepspeed_features(DeepSpeedConfig(dict(base, gradient_clipping=1.0)))  # runs
        for extra, part in [({"fp16": {"enabled": True}}, "fp16"), ({"bf16": {"enabled": True}}, "bf16"),
                            ({"zero_optimization": {"stage": 2}}, "ZeRO stage 2"),
                            ({"zero_optimization": {"stage": 1}, "gradient_clipping": 1.0}, "gradient_clipping"),
                            ({"pipeline": {"activation_checkpoint_interval": 1}}, "activation_checkpoint_interval")]:
            with self.assertRaises(braid.BadConfigError) as cm:
                _check_deepspeed_features(DeepSpeedConfig(dict(base, **extra)))
            self.assertIn(part, str(cm.exception))

    def test_importing_the_engine_under_another_release_fails_clearly(self):
        with tempfile.TemporaryDirectory() as tmp:
            os.makedirs(os.path.join(tmp, "deepspeed"))
            with open(os.path.join(tmp, "deepspeed", "__init__.py"), "w") as f:
                f.write('__version__ = "0.12.6"\n')
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([tmp, os.path.join(SOURCE_DIR, "integrations", "python")]))
            code = textwrap.dedent("""
                import braid.deepspeed.engine
            """)
            done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        self.assertNotEqual(done.returncode, 0)
        self.assertIn("DeepSpeedVersionError", done.stderr)
        self.assertIn("0.14.5", done.stderr)
        self.assertIn("0.12.6", done.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
