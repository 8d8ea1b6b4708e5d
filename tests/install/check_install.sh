#!/usr/bin/env bash
# Installs braid from a build folder and uses it from a project outside the tree.
#
#   check_install.sh MODE BUILD_DIR SOURCE_DIR WORK_DIR
#
#   find_package  cmake --install into WORK_DIR/prefix; build tests/install/consumer with
#                 find_package(braid) (the C program and a plugin); run the program; run
#                 the installed CLI and check it finds the installed plugins
#   pkg-config    the same install; build the program with `pkg-config --cflags --libs braid`
#                 and the plugin with its plugin include folder; run the program
#   deb           cpack -G DEB; unpack the package into WORK_DIR/root; check its metadata;
#                 then both of the above against WORK_DIR/root/usr
#   subproject    configure tests/install/subproject (braid through add_subdirectory) with
#                 GoogleTest and Boost hidden from find_package: neither is needed (BLAS is:
#                 libbraid.so's tiled contrastive loss links OpenBLAS)
set -euo pipefail
mode=$1 build=$(realpath "$2") source=$(realpath "$3") work=$4
run_file=$source/configs/runs/tiny-clip.yaml
rm -rf "$work"
mkdir -p "$work"
work=$(realpath "$work")
log=$work/log.txt

step() { echo "-- $*"; }
quiet() {  # runs a command with its output in the log; shows the log if it fails
  if ! "$@" >>"$log" 2>&1; then
    echo "failed: $*" >&2
    tail -n 40 "$log" >&2
    exit 1
  fi
}

run_consumer() {  # BINARY LIBDIR
  local out
  out=$(LD_LIBRARY_PATH=$2 "$1" "$run_file")
  echo "$out"
  grep -q "planned $run_file" <<<"$out"
}

check_plugin_exports() {  # PLUGIN.so
  local exported
  exported=$(nm -D --defined-only "$1" | awk '{print $NF}' | grep -v -E '^(_init|_fini|_edata|_end|__bss_start)$')
  if [ "$exported" != "braidDevicePlugin_v1" ]; then
    echo "$1 exports '$exported', expected braidDevicePlugin_v1 only" >&2
    exit 1
  fi
}

with_find_package() {  # PREFIX
  local prefix=$1 out=$work/consumer-cmake
  step "find_package(braid) against $prefix"
  quiet cmake -S "$source/tests/install/consumer" -B "$out" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release
  quiet cmake --build "$out"
  check_plugin_exports "$out/libbraid-example.so"
  run_consumer "$out/consumer" "$(dirname "$(find "$prefix" -name 'libbraid.so' | head -n 1)")"
}

with_pkg_config() {  # PREFIX
  local prefix=$1 out=$work/consumer-pkg-config pc libdir
  pc=$(dirname "$(find "$prefix" -name braid.pc | head -n 1)")
  step "pkg-config braid from $pc"
  mkdir -p "$out"
  export PKG_CONFIG_PATH=$pc
  pkg-config --exists --print-errors 'braid >= 0.1'
  libdir=$(pkg-config --variable=libdir braid)
  # shellcheck disable=SC2046
  quiet cc -std=c99 -Wall -Wextra -Wpedantic -Werror -o "$out/consumer" "$source/tests/install/consumer/consumer.c" \
    $(pkg-config --cflags --libs braid)
  # shellcheck disable=SC2046
  quiet cc -std=c99 -Wall -Wextra -Werror -shared -fPIC -fvisibility=hidden -o "$out/libbraid-example.so" \
    "$source/tests/install/consumer/example_plugin.c" -I"$(pkg-config --variable=includedir braid)/braid/plugins"
  check_plugin_exports "$out/libbraid-example.so"
  run_consumer "$out/consumer" "$libdir"
}

check_cli() {  # PREFIX: the installed CLI, started from PATH elsewhere, finds the installed plugins by itself
  local prefix=$1 info plugin_dir
  plugin_dir=$(dirname "$(find "$prefix" -name 'libbraid-mpi.so' | head -n 1)")
  step "installed CLI: braid info, $prefix/bin on PATH, from /"
  info=$(cd / && env -u BRAID_PLUGIN_PATH PATH="$prefix/bin:$PATH" braid info --format json)
  python3 - "$plugin_dir" "$info" <<'PY'
import json, sys
plugin_dir, info = sys.argv[1], json.loads(sys.argv[2])
assert plugin_dir in info["plugin_path"], f"{plugin_dir} not in the plugin path {info['plugin_path']}"
mpi = [p for p in info["plugins"] if p["name"] == "mpi"][0]
assert mpi["path"] == plugin_dir + "/libbraid-mpi.so", mpi
host = [p for p in info["plugins"] if p["name"] == "host"][0]
assert host["path"] == plugin_dir + "/libbraid-host.so" and host["interface"] == 2, host
assert len(host["devices"]) == 1 and host["devices"][0]["host_memory"], host
print(f"   plugin path {info['plugin_path']}; mpi: {mpi['status'][:60]}; host: {host['status']}")
PY
  # Started by its path through a link elsewhere (/usr/local/bin/braid -> /opt/braid/bin/braid):
  # the link is followed to the install, whose plugins it finds (it found none before).
  step "installed CLI: braid info through a link, started by its path, from /"
  mkdir -p "$prefix/../links"
  ln -sf "$prefix/bin/braid" "$prefix/../links/braid"
  info=$(cd / && env -u BRAID_PLUGIN_PATH "$prefix/../links/braid" info --format json)
  python3 - "$plugin_dir" "$info" <<'PY'
import json, sys
plugin_dir, info = sys.argv[1], json.loads(sys.argv[2])
assert plugin_dir in info["plugin_path"], f"{plugin_dir} not in the plugin path {info['plugin_path']}"
PY
}

case $mode in
  find_package | pkg-config)
    step "cmake --install $build --prefix $work/prefix"
    quiet cmake --install "$build" --prefix "$work/prefix"
    if [ "$mode" = find_package ]; then
      with_find_package "$work/prefix"
      check_cli "$work/prefix"
    else
      with_pkg_config "$work/prefix"
    fi
    ;;
  deb)
    step "cpack -G DEB"
    quiet cpack -G DEB --config "$build/CPackConfig.cmake" -B "$work/package"
    deb=$(find "$work/package" -maxdepth 1 -name 'braid_*.deb' | head -n 1)
    [ -n "$deb" ] || { echo "cpack wrote no braid_*.deb" >&2; exit 1; }
    step "$(basename "$deb"): $(du -h "$deb" | cut -f1)"
    dpkg-deb --field "$deb" Package Version Architecture Depends | sed 's/^/   /'
    dpkg-deb --field "$deb" Depends | grep -q libyaml-cpp || { echo "Depends misses yaml-cpp" >&2; exit 1; }
    dpkg-deb --field "$deb" Depends | grep -q libopenblas || { echo "Depends misses OpenBLAS" >&2; exit 1; }
    contents=$(dpkg-deb --contents "$deb" | awk '{print $6}')
    for want in '/usr/bin/braid$' '/usr/include/braid/braid.h$' '/usr/include/braid/plugins/braid_comm_v1.h$' \
      '/usr/lib/.*libbraid.so.[0-9]+$' '/usr/lib/.*braid/libbraid-mpi.so$' '/usr/lib/.*braid/libbraid-host.so$' \
      '/usr/include/braid/plugins/braid_device_v2.h$' '/usr/lib/.*cmake/braid/braidConfig.cmake$' \
      '/usr/lib/.*pkgconfig/braid.pc$'; do
      grep -qE "$want" <<<"$contents" || { echo "the package holds no file matching $want" >&2; exit 1; }
    done
    step "dpkg-deb -x into $work/root"
    dpkg-deb -x "$deb" "$work/root"
    with_find_package "$work/root/usr"
    with_pkg_config "$work/root/usr"
    check_cli "$work/root/usr"
    ;;
  subproject)
    step "add_subdirectory(braid) without GoogleTest or Boost"
    quiet cmake -S "$source/tests/install/subproject" -B "$work/subproject" -DBRAID_SOURCE_DIR="$source" \
      -DBRAID_WITH_CUDA=OFF -DCMAKE_DISABLE_FIND_PACKAGE_GTest=ON -DCMAKE_DISABLE_FIND_PACKAGE_Boost=ON
    grep "braid as a subproject" "$log" | sed 's/^-- /   /'
    ;;
  *)
    echo "check_install.sh: unknown mode '$mode' (find_package, pkg-config, deb or subproject)" >&2
    exit 2
    ;;
esac
echo "ok: $mode"
