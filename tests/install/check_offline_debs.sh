#!/usr/bin/env bash
# scripts/offline-debs end to end, on two small packages: collect them with their
# dependencies from the mirror, unpack them into a prefix, build and run a project against
# the prefix alone (CMake finds them there, the binary loads them from there), and refuse a
# folder whose files differ from its manifest. Exits 77 (skipped) when no Debian mirror is
# reachable, since collect needs one.
#
#   check_offline_debs.sh SOURCE_DIR WORK_DIR
set -euo pipefail
source_dir=$1 work=$2
rm -rf "$work"
mkdir -p "$work"
fail() {
  echo "check_offline_debs: $*" >&2
  exit 1
}

if ! (cd "$work" && apt-get download -q nlohmann-json3-dev >/dev/null 2>&1); then
  echo "check_offline_debs: skipped: no Debian mirror reachable (apt-get download failed)"
  exit 77
fi
rm -f "$work"/*.deb

"$source_dir/scripts/offline-debs" collect "$work/debs" libyaml-cpp-dev nlohmann-json3-dev
grep -q "^libyaml-cpp-dev$" "$work/debs/packages.txt" || fail "packages.txt lacks libyaml-cpp-dev"
compgen -G "$work/debs/libyaml-cpp0.*_*.deb" >/dev/null || fail "the runtime library libyaml-cpp-dev depends on was not collected"

# This machine has both installed: by default they are left out, --all unpacks them.
"$source_dir/scripts/offline-debs" unpack --all "$work/debs" "$work/prefix"
[ -f "$work/prefix/braid-env.sh" ] || fail "no braid-env.sh"
(
  . "$work/prefix/braid-env.sh"
  cmake -S "$source_dir/tests/install/offline_consumer" -B "$work/build" >"$work/configure.log" 2>&1 ||
    fail "configure failed: $(tail -5 "$work/configure.log")"
  grep -q "yaml-cpp from $work/prefix/" "$work/configure.log" || fail "yaml-cpp not found in the prefix: $(grep from "$work/configure.log")"
  grep -q "nlohmann_json from $work/prefix/" "$work/configure.log" || fail "nlohmann_json not found in the prefix"
  cmake --build "$work/build" >"$work/build.log" 2>&1 || fail "build failed: $(tail -5 "$work/build.log")"
  [ "$("$work/build/consumer")" = '{"layers":2}' ] || fail "the consumer printed something else"
  # Whole, then searched: grep -q would close the pipe early, and pipefail would see ldd's SIGPIPE.
  loaded=$(ldd "$work/build/consumer")
  grep -q "libyaml-cpp.so.* => $work/prefix/" <<<"$loaded" || fail "libyaml-cpp not loaded from the prefix: $loaded"
)

# What installing them would do, without doing it (apt-get -s, nothing downloaded).
out=$("$source_dir/scripts/offline-debs" install --dry-run "$work/debs" 2>&1) || fail "install --dry-run failed: $out"
grep -q "libyaml-cpp-dev" <<<"$out" || fail "install --dry-run does not mention libyaml-cpp-dev: $out"

# A file that differs from the manifest is refused, naming it.
deb=$(ls "$work/debs"/nlohmann-json3-dev_*.deb)
echo corrupt >>"$deb"
if out=$("$source_dir/scripts/offline-debs" unpack "$work/debs" "$work/prefix2" 2>&1); then
  fail "unpack accepted a corrupted folder"
fi
grep -q "$(basename "$deb")" <<<"$out" || fail "the refusal does not name the corrupted file: $out"
grep -q "differ from manifest.txt" <<<"$out" || fail "the refusal does not say why: $out"
echo "check_offline_debs: collected, unpacked, built and ran against the prefix; a corrupted folder refused"
