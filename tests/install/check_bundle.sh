#!/usr/bin/env bash
# scripts/bundle end to end: bundle the build, unpack it under a path with a space, and from a
# clean environment that sources only its env.sh: braid and its plugins load the bundle's
# libraries (not this machine's), and the bundle's own mpiexec runs a 2-rank training. An
# unknown option and a missing build are refused.
#
#   check_bundle.sh SOURCE_DIR BUILD_DIR WORK_DIR
set -euo pipefail
source_dir=$1 build=$2 work=$3
rm -rf "$work"
mkdir -p "$work/un packed"
fail() {
  echo "check_bundle: $*" >&2
  exit 1
}

"$source_dir/scripts/bundle" --build "$build" "$work/braid.tar.gz"
tar -C "$work/un packed" -xzf "$work/braid.tar.gz"
root="$work/un packed/braid"
for f in bin/braid lib/libbraid.so plugins/libbraid-host.so env.sh configs/runs/tiny-clip.yaml; do
  [ -e "$root/$f" ] || fail "the bundle lacks $f"
done

# A clean environment: only what env.sh sets, plus mpiexec's permission to run as root in CI.
in_bundle() {
  env -i HOME="$HOME" PATH=/usr/bin:/bin OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    bash -c '. "$0/env.sh" 2>/dev/null && cd "$0" && eval "$1"' "$root" "$1"
}
# Sourced by a script under set -e (a library not found is no failure), and refused by name
# from a shell without BASH_SOURCE.
sourced=$(env -i HOME="$HOME" PATH=/usr/bin:/bin bash -c 'set -euo pipefail; . "$0/env.sh" 2>/dev/null; echo sourced' \
  "$root") || fail "env.sh stopped a set -e script"
[ "$sourced" = sourced ] || fail "env.sh under set -e: $sourced"
if env -i PATH=/usr/bin:/bin sh -c '. "$0/env.sh"' "$root" 2>"$work/sh.err"; then fail "sh sourced env.sh"; fi
grep -q "source this file from bash" "$work/sh.err" || fail "sh was not told to use bash: $(cat "$work/sh.err")"
libs=$(in_bundle 'ldd bin/braid')
for lib in libyaml-cpp libboost_program_options libopenblas; do
  echo "$libs" | grep "$lib" | grep -qF "$root/deps/" || fail "braid does not load $lib from the bundle: $libs"
done
info=$(in_bundle 'braid info')
echo "$info" | grep -qF "plugin path  $root/plugins" || fail "braid info does not name the bundle's plugins: $info"
echo "$info" | grep -q "plugin host  loaded" || fail "the host plugin did not load: $info"
if [ -d "$root/mpi/usr/bin" ]; then
  where=$(in_bundle 'command -v mpiexec')
  [ "$where" = "$root/mpi/usr/bin/mpiexec" ] || fail "mpiexec is not the bundle's: $where"
  components=$(in_bundle 'ompi_info --path pkglibdir')
  echo "$components" | grep -qF "$root/mpi/usr/lib" || fail "Open MPI does not take its components from the bundle: $components"
  in_bundle 'mpiexec --oversubscribe -n 2 braid train --config configs/runs/tiny-clip.yaml --steps 2 --quiet' \
    >"$work/train.log" 2>&1 || fail "2 ranks from the bundle failed: $(cat "$work/train.log")"
fi

if "$source_dir/scripts/bundle" --bogus "$work/x.tar.gz" 2>"$work/err"; then fail "an unknown option was taken"; fi
grep -q "unknown option --bogus" "$work/err" || fail "unknown option not named: $(cat "$work/err")"
if "$source_dir/scripts/bundle" --build "$work/none" "$work/x.tar.gz" 2>"$work/err"; then fail "a missing build was taken"; fi
grep -q "no build folder" "$work/err" || fail "missing build not named: $(cat "$work/err")"
[ ! -e "$work/x.tar.gz" ] || fail "a refused run left an output"
rm -rf "$work"
echo "check_bundle: ok"
