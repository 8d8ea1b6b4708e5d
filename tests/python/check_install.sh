#!/usr/bin/env bash
# `pip install integrations/python` into a fresh virtual environment, then import braid
# from outside the source tree with BRAID_LIBRARY set: the package (and its torch and
# deepspeed shims) installs with no network and no dependency, and finds libbraid.so.
# Debian's pip refuses to install into the system interpreter (PEP 668), hence the venv;
# --system-site-packages and --no-build-isolation let it build with the system's
# setuptools (and the tests use the system's numpy/torch) without downloading anything.
# usage: check_install.sh PYTHON SOURCE_DIR LIBBRAID_SO
set -euo pipefail
python=$1
source_dir=$2
library=$3

scratch=$(mktemp -d "${TMPDIR:-/tmp}/braid-install.XXXXXX")
trap 'rm -rf "$scratch"' EXIT

# pip builds in the directory it is given (build/, braid.egg-info): give it a copy, so the
# checkout stays clean and concurrent runs do not meet.
cp -r "$source_dir/integrations/python" "$scratch/src"
find "$scratch/src" \( -name __pycache__ -o -name build -o -name '*.egg-info' \) -prune -exec rm -rf {} +
rm -f "$scratch/src/braid/libbraid.so"*

"$python" -m venv --system-site-packages "$scratch/venv"
"$scratch/venv/bin/python" -m pip install --quiet --no-build-isolation --no-index "$scratch/src"

cd "$scratch"
env -u PYTHONPATH BRAID_LIBRARY="$library" PYTHONDONTWRITEBYTECODE=1 "$scratch/venv/bin/python" - "$scratch/venv" <<'PY'
import importlib.metadata
import importlib.util
import os
import sys

import braid

venv = os.path.realpath(sys.argv[1])
where = os.path.realpath(braid.__file__)
assert where.startswith(venv + os.sep), f"braid imported from {where}, not from the venv {venv}"
assert braid.abi_version() == braid.ABI_VERSION, (braid.abi_version(), braid.ABI_VERSION)
assert importlib.metadata.version("braid") == braid.version(), (importlib.metadata.version("braid"), braid.version())
assert braid.load_library()._braid_found_via == "BRAID_LIBRARY"
for shim in ("braid.torch", "braid.deepspeed"):  # installed (not imported: they need their frameworks)
    spec = importlib.util.find_spec(shim)
    assert spec is not None and os.path.realpath(spec.origin).startswith(venv + os.sep), (shim, spec)
print(f"installed braid {braid.version()} (ABI {braid.abi_version()}) at {os.path.dirname(where)}")
PY
