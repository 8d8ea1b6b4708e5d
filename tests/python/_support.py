"""What the binding's tests share: the braid package of this checkout, the run files,
and small runs written inline.

Environment: BRAID_LIBRARY (the libbraid.so to test; the tests skip without it),
BRAID_SOURCE_DIR (the repository, for configs/; default: two directories up).
"""

import os
import sys
import unittest

SOURCE_DIR = os.path.abspath(
    os.environ.get("BRAID_SOURCE_DIR") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
)
try:
    import braid
except ImportError:  # not on PYTHONPATH: use the package of this checkout
    sys.path.insert(0, os.path.join(SOURCE_DIR, "integrations", "python"))
    import braid

RUNS = os.path.join(SOURCE_DIR, "configs", "runs")
CLIP = os.path.join(RUNS, "clip-vit-l14-64gpu.yaml")
VIT22B = os.path.join(RUNS, "vit22b-gpt175b-3072gpu.yaml")
MLLM = os.path.join(RUNS, "mllm-72b-1024gpu.yaml")
LLAVA = os.path.join(RUNS, "llava-13b-256gpu.yaml")
GPT175B = os.path.join(RUNS, "gpt-175b-1024gpu.yaml")

LLAVA_32GPU = """\
name: llava-13b-32gpu
model: ../models/llava-13b.yaml
cluster: ../clusters/dgx-a100-80gb.yaml
nodes: 4
training: {global_batch: 32, microbatch: 1, zero_stage: 1, recompute: full}
data: {image: {resolution: 336}, text: {tokens: 1472}}
"""


def require_library():
    """For setUpModule: skip the module without BRAID_LIBRARY."""
    if not os.environ.get("BRAID_LIBRARY"):
        raise unittest.SkipTest("set BRAID_LIBRARY to build/capi/libbraid.so to test the binding")


def llava_config():
    """LLaVA-13B on 4 nodes (32 devices): megatron tp=8 pp=4 gives 4 stages, dp=1."""
    return braid.Config.from_string(LLAVA_32GPU, base_dir=RUNS)


def by_name(modules):
    return {m.name: m for m in modules}


def ops(instructions, *names):
    """The instructions whose opcode is one of ``names``."""
    return [i for i in instructions if i.opcode in names]
