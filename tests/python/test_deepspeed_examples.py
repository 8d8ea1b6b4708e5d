"""The DeepSpeed examples (examples/deepspeed_*.py) run as their README launches them:
``python3 -m torch.distributed.run --nproc_per_node 4`` on CPU processes, here for 2
steps, each printing its loss and every rank its share of braid's program.

Environment: as test_deepspeed_engine.py (BRAID_LIBRARY, PYTHONPATH with
integrations/python, DeepSpeed installed or in BRAID_DEEPSPEED_PATH); BRAID_EXAMPLE
picks one example ("clip", "disttrain", "optimus"; default: clip).
"""

import importlib
import os
import re
import socket
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_deepspeed_config import SOURCE_DIR, find_deepspeed  # noqa: E402

try:
    importlib.import_module("torch")
    DEEPSPEED, REASON = find_deepspeed()
except ImportError as e:  # pragma: no cover - depends on the machine
    DEEPSPEED, REASON = None, f"PyTorch is not importable ({e}); install python3-torch"
if REASON:
    print(f"test_deepspeed_examples: skipping: {REASON}", file=sys.stderr)

EXAMPLES = {
    "clip": ["deepspeed_clip_distmm.py"],
    "disttrain": ["deepspeed_mllm.py", "--strategy", "disttrain"],
    "optimus": ["deepspeed_mllm.py", "--strategy", "optimus"],
}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@unittest.skipIf(REASON, REASON)
class ExampleRuns(unittest.TestCase):
    def launch(self, example, steps=2):
        script, *args = EXAMPLES[example]
        pythonpath = [os.path.join(SOURCE_DIR, "integrations", "python")]
        pythonpath += [p for p in os.environ.get("BRAID_DEEPSPEED_PATH", "").split(os.pathsep) if p]
        pythonpath += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(pythonpath), DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
        # --redirects 1 --tee 1: torch 1.13's launcher fails on Python 3.11 with its default
        # stream settings ("'NoneType' object has no attribute 'get'"); stdout is teed instead.
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "4", "--master_addr",
                   "127.0.0.1", "--master_port", str(free_port()), "--redirects", "1", "--tee", "1",
                   os.path.join(SOURCE_DIR, "examples", script),
                   *args, "--steps", str(steps), "--print-every", "1"]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
        output = done.stdout + done.stderr
        self.assertEqual(done.returncode, 0, f"{' '.join(command)} failed:\n{output[-6000:]}")
        losses = [float(m) for m in re.findall(rf"step \d+/{steps}: loss ([0-9.]+)", done.stdout)]
        self.assertEqual(len(losses), steps, done.stdout)
        ranks = sorted(int(m) for m in re.findall(r"^(?:\[\w+\]:)?rank (\d+): ", done.stdout, re.MULTILINE))
        self.assertEqual(ranks, [0, 1, 2, 3], done.stdout)
        return done.stdout

    def test_example(self):
        example = os.environ.get("BRAID_EXAMPLE", "clip")
        out = self.launch(example)
        if example == "clip":
            self.assertIn("BatchSync x1", out)


if __name__ == "__main__":
    unittest.main(verbosity=2)
