"""The vocabularies come from the library (braid/vocabulary.h): each is non-empty, has
distinct names, indexes the C enum values (an instruction's opcode name is the name of
its C opcode), agrees with what the library itself prints and accepts, and the binding
holds no copy of them.

Environment: BRAID_LIBRARY (the libbraid.so to test; required).
"""

import ctypes
import os
import re
import unittest

from _support import SOURCE_DIR, braid, llava_config
from _support import require_library as setUpModule  # noqa: F401

from braid import _structs

VOCABULARIES = ("strategies", "schedules", "opcodes", "bubble_causes", "reorderings", "axes", "bubble_schedules",
                "precisions", "recomputes", "attentions")


class Index:
    """An integer that is not an int, as numpy's are: it has __index__."""

    def __init__(self, value):
        self.value = value

    def __index__(self):
        return self.value


class VocabularyTest(unittest.TestCase):
    def test_every_vocabulary_is_non_empty_and_distinct(self):
        for name in VOCABULARIES:
            names = getattr(braid.vocab, name)()
            self.assertIsInstance(names, tuple, name)
            self.assertTrue(names, name)
            self.assertTrue(all(isinstance(n, str) and n for n in names), name)
            self.assertEqual(len(set(names)), len(names), name)

    def test_sizes_of_the_c_enums(self):
        self.assertEqual(len(braid.vocab.bubble_causes()), _structs.BUBBLE_COUNT)
        self.assertEqual(braid.vocab.axes(), ("tp", "dp", "pp"))
        self.assertEqual(braid.vocab.strategies()[0], "auto")  # BRAID_STRATEGY_AUTO = 0
        self.assertLess(set(braid.vocab.bubble_schedules()), set(braid.vocab.schedules()))

    def test_legacy_upper_case_names(self):
        self.assertEqual(braid.STRATEGIES, braid.vocab.strategies())
        self.assertEqual(braid.SCHEDULES, braid.vocab.schedules())
        self.assertEqual(braid.OPCODES, braid.vocab.opcodes())
        self.assertEqual(braid.BUBBLE_CAUSES, braid.vocab.bubble_causes())
        self.assertEqual(braid.REORDERINGS, braid.vocab.reorderings())
        self.assertEqual(braid.BUBBLE_SCHEDULES, braid.vocab.bubble_schedules())
        self.assertEqual(braid.vocab.AXES, braid.vocab.axes())
        with self.assertRaises(AttributeError):
            braid.NO_SUCH_NAME
        with self.assertRaises(AttributeError):
            braid.vocab.NO_SUCH_NAME

    def test_opcode_names_round_trip_through_the_c_values(self):
        with llava_config() as config, config.plan("megatron", tp=8, pp=4) as p, p.program() as program:
            lib = braid.load_library()
            ptr = program._ptr()
            opcodes = braid.vocab.opcodes()
            seen = set()
            for s in range(len(program.stages)):
                records = program.instructions(s)
                for i, record in enumerate(records):
                    raw = _structs.new(_structs.braid_instruction)
                    self.assertEqual(lib.braid_program_instruction(ptr, s, i, ctypes.byref(raw)), 0)
                    self.assertEqual(opcodes[raw.opcode], record.opcode)
                    self.assertEqual(opcodes.index(record.opcode), raw.opcode)
                    seen.add(record.opcode)
            self.assertTrue({"LoadMicrobatch", "Forward", "Backward", "OptimizerStep"} <= seen)

    def test_the_library_accepts_its_own_names(self):
        with llava_config() as config:
            for value, name in enumerate(braid.vocab.strategies()):
                self.assertEqual(braid.vocab.value_of(_structs.VOCABULARY_STRATEGY, name, "strategy"), value)
                # An integer of another type (numpy.int64, an array's element) is a value too.
                self.assertEqual(braid.vocab.value_of(_structs.VOCABULARY_STRATEGY, Index(value), "strategy"), value)
            with config.plan("disttrain") as p:
                for name in braid.vocab.reorderings():
                    p.reorder(text_tokens=[64] * 32, reordering=name)
            for name in braid.vocab.recomputes():
                self.assertEqual(config.set_run_settings(recompute=name).recompute, name)

    def test_unknown_names_suggest_the_closest(self):
        with self.assertRaises(braid.InvalidArgumentError) as cm:
            braid.vocab.value_of(_structs.VOCABULARY_REORDERING, "intra-inter", "reordering")
        self.assertIn("did you mean 'intra_inter'?", str(cm.exception))
        with self.assertRaises(braid.InvalidArgumentError):
            braid.vocab.value_of(_structs.VOCABULARY_REORDERING, 3, "reordering")
        self.assertEqual(braid.vocab.name_of(_structs.VOCABULARY_OPCODE, 99), 99)

    def test_cached_until_the_library_is_reset(self):
        first = braid.vocab.opcodes()
        self.assertIs(braid.vocab.opcodes(), first)
        braid._reset_library()
        again = braid.vocab.opcodes()
        self.assertIsNot(again, first)
        self.assertEqual(again, first)

    def test_by_cause(self):
        values = tuple(float(k) for k in range(_structs.BUBBLE_COUNT))
        d = braid.vocab.by_cause(values)
        self.assertEqual(tuple(d), braid.vocab.bubble_causes())
        self.assertEqual(tuple(d.values()), values)

    def test_macros_mirror_the_header(self):
        with open(os.path.join(SOURCE_DIR, "capi", "include", "braid", "pipeline.h")) as f:
            macros = re.findall(r"^#define BRAID_((?:FLAG|ENCODER)_\w+) ([^/]+?)\s*(?:/\*.*)?$", f.read(), re.M)
        self.assertGreaterEqual(len(macros), 6)
        for name, value in macros:
            expected = eval(re.sub(r"(\d+)u\b", r"\1", value), {})  # "16u", "(1 << 24)"
            self.assertEqual(getattr(braid.vocab, name), expected, name)
            if name.startswith("FLAG_"):
                self.assertEqual(getattr(braid, name), expected, name)

    def test_no_vocabulary_literal_in_the_package(self):
        # No opcode or schedule name is a string in the code of the braid
        # package (docstrings aside; its framework shims, which dispatch on opcodes, aside).
        import ast

        package = os.path.dirname(braid.__file__)
        owned = set(braid.vocab.opcodes()) | set(braid.vocab.schedules()) | set(braid.vocab.bubble_schedules())
        owned -= set(braid.records.__all__)  # the BatchSync record type is named after its C struct
        for name in sorted(os.listdir(package)):
            if not name.endswith(".py"):
                continue
            with open(os.path.join(package, name)) as f:
                tree = ast.parse(f.read())
            docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                          if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) and node.body
                          and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
            literals = {node.value for node in ast.walk(tree)
                        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings}
            self.assertEqual(sorted(literals & owned), [], name)

if __name__ == "__main__":
    unittest.main()
