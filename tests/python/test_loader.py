"""Finding and checking libbraid.so: the lookup order (next to the package, then
BRAID_LIBRARY, then the system loader), the cache, the refusal of a library of another
ABI version or of one that is not libbraid.so, and errors whose class follows the status.

Environment: BRAID_LIBRARY (the libbraid.so to test; required).
"""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

from _support import SOURCE_DIR, braid
from _support import require_library as setUpModule  # noqa: F401

from braid import _loader


def find_libm():
    import ctypes.util

    return ctypes.util.find_library("m")


class LoaderTest(unittest.TestCase):
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

    def test_lookup_order(self):
        with tempfile.TemporaryDirectory(prefix="braid-lookup-") as d:
            env = {"BRAID_LIBRARY": "/somewhere/libbraid.so"}
            found = list(_loader._candidates(package=d, environ=env))
            self.assertEqual(found[0], ("BRAID_LIBRARY", "/somewhere/libbraid.so", True))
            self.assertTrue(all(how == "the system loader" and not final for how, _, final in found[1:]))
            self.assertEqual(found[-1][1], "libbraid.so")
            # A library next to the package comes first.
            open(os.path.join(d, "libbraid.so"), "w").close()
            found = list(_loader._candidates(package=d, environ=env))
            self.assertEqual(found[0], ("next to the package", os.path.join(d, "libbraid.so"), True))
            self.assertEqual(found[1][0], "BRAID_LIBRARY")
            # Without either, only the system loader is asked.
            found = list(_loader._candidates(package=os.path.join(d, "elsewhere"), environ={}))
            self.assertEqual({how for how, _, _ in found}, {"the system loader"})

    def test_library_next_to_the_package_wins_over_braid_library(self):
        # A copy of the package with libbraid.so beside it, in a fresh interpreter whose
        # BRAID_LIBRARY points nowhere: the bundled library is the one loaded.
        with tempfile.TemporaryDirectory(prefix="braid-bundled-") as d:
            package = os.path.join(d, "braid")
            shutil.copytree(os.path.dirname(braid.__file__), package,
                            ignore=shutil.ignore_patterns("__pycache__", "torch", "deepspeed"))
            os.symlink(os.path.realpath(os.environ["BRAID_LIBRARY"]), os.path.join(package, "libbraid.so"))
            env = dict(os.environ, BRAID_LIBRARY=os.path.join(d, "no-such", "libbraid.so"), PYTHONPATH=d,
                       PYTHONDONTWRITEBYTECODE="1")
            code = ("import braid; lib = braid.load_library(); "
                    "print(braid.__file__); print(lib._name); print(lib._braid_found_via); print(braid.abi_version())")
            out = subprocess.run([sys.executable, "-c", code], env=env, cwd=d, capture_output=True, text=True)
            self.assertEqual(out.returncode, 0, out.stderr)
            lines = out.stdout.splitlines()
            self.assertTrue(lines[0].startswith(package), lines)
            self.assertEqual(lines[1], os.path.join(package, "libbraid.so"))
            self.assertEqual(lines[2], "next to the package")
            self.assertEqual(lines[3], str(braid.ABI_VERSION))

    def test_abi_check_refuses_another_version(self):
        with self.assertRaises(braid.BraidError) as cm:
            braid._check_abi(braid.abi_version(), expected=braid.ABI_VERSION + 1, path="libbraid.so")
        self.assertIsInstance(cm.exception, braid.AbiMismatchError)
        self.assertIn("ABI version", str(cm.exception))
        braid._check_abi(braid.abi_version())  # the matching version passes

    def test_abi_mismatch_when_loading(self):
        saved = _loader.ABI_VERSION
        braid._reset_library()
        _loader.ABI_VERSION = saved + 1
        try:
            with self.assertRaises(braid.AbiMismatchError) as cm:
                braid.version()
            self.assertEqual(cm.exception.status, braid.ERR_UNSUPPORTED)
            self.assertIn(os.environ["BRAID_LIBRARY"], str(cm.exception))
            self.assertIn(f"ABI version {saved + 1}", str(cm.exception))
            self.assertIn(f"ABI version {saved},", str(cm.exception))
            with self.assertRaises(braid.AbiMismatchError):  # nothing half-loaded was cached
                braid.vocab.opcodes()
        finally:
            _loader.ABI_VERSION = saved
            braid._reset_library()
        self.assertEqual(braid.abi_version(), saved)

    @unittest.skipUnless(find_libm(), "no libm to load")
    def test_a_library_that_is_not_braid(self):
        saved = os.environ["BRAID_LIBRARY"]
        braid._reset_library()
        os.environ["BRAID_LIBRARY"] = find_libm()
        try:
            with self.assertRaises(braid.AbiMismatchError) as cm:
                braid.version()
            self.assertIn("does not export braid_abi_version", str(cm.exception))
        finally:
            os.environ["BRAID_LIBRARY"] = saved
            braid._reset_library()

    def test_missing_library_path(self):
        saved = os.environ["BRAID_LIBRARY"]
        braid._reset_library()
        os.environ["BRAID_LIBRARY"] = os.path.join(tempfile.gettempdir(), "no-such-dir", "libbraid.so")
        try:
            with self.assertRaises(braid.LibraryNotFoundError) as cm:
                braid.version()
            self.assertIsInstance(cm.exception, braid.BraidIOError)
            self.assertIn("no-such-dir", str(cm.exception))
            self.assertIn("BRAID_LIBRARY", str(cm.exception))
        finally:
            os.environ["BRAID_LIBRARY"] = saved
            braid._reset_library()

    def test_every_signature_is_bound(self):
        lib = braid.load_library()
        missing = [name for name in _loader._SIGNATURES if not _loader.has(name)]
        self.assertEqual(missing, [], "entry points this libbraid.so lacks")
        for name, (restype, argtypes) in _loader._SIGNATURES.items():
            fn = getattr(lib, name)
            self.assertEqual(fn.restype, restype, name)
            self.assertEqual(list(fn.argtypes), list(argtypes), name)

    def test_signatures_name_every_entry_point_of_the_headers(self):
        import re

        # Every BRAID_API function of capi/include/braid is in the one signature table, with
        # as many arguments as the header declares.
        include = os.path.join(SOURCE_DIR, "capi", "include", "braid")
        declared = {}
        for header in os.listdir(include):
            with open(os.path.join(include, header)) as f:
                for name, params in re.findall(r"BRAID_API\s+[^;(]*?\b(braid_\w+)\s*\(([^)]*)\)", f.read()):
                    declared[name] = 0 if params.strip() in ("", "void") else params.count(",") + 1
        self.assertGreater(len(declared), 40)
        self.assertEqual(sorted(set(declared) - set(_loader._SIGNATURES)), [])
        for name, arity in declared.items():
            self.assertEqual(len(_loader._SIGNATURES[name][1]), arity, name)


class ErrorTest(unittest.TestCase):
    def test_error_classes(self):
        for status, cls in [(1, braid.InvalidArgumentError), (2, braid.BadConfigError), (3, braid.InfeasibleError),
                            (4, braid.BraidIOError), (5, braid.UnsupportedError), (6, braid.InternalError),
                            (7, braid.OutOfHostMemoryError), (8, braid.PluginError)]:
            e = braid.BraidError(status, "message")
            self.assertIsInstance(e, cls)
            self.assertIsInstance(e, braid.BraidError)
            self.assertEqual(e.status, status)
            self.assertEqual(cls.status, status)
            self.assertEqual(str(e), "message")
            self.assertEqual(e.status_name, braid.status_string(status))

    def test_status_name_is_the_librarys(self):
        self.assertEqual(braid.BraidError(2).status_name, "bad configuration")
        self.assertEqual(str(braid.BraidError(3)), "infeasible")

    def test_pickles(self):
        import pickle

        e = pickle.loads(pickle.dumps(braid.BraidError(2, "bad")))
        self.assertIsInstance(e, braid.BadConfigError)
        self.assertEqual((e.status, e.message), (2, "bad"))


if __name__ == "__main__":
    unittest.main()
