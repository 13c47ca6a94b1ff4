#!/usr/bin/env bash
# The anchor's ci/build_scripts/lib/wheel_pack.sh `strip_wheel_local_version [dist]`
# (reference §9.1), as a measuring stick for benchmarks/strip.py. For each dist/*.whl whose
# basename contains '+':
#   1. python -m wheel unpack --dest <tmp>
#   2. read Version: from *.dist-info/METADATA; clean = version%%+*; rewrite the line with sed
#   3. rename the unpacked root dir (s/<version>$/<clean>/) and every *.dist-info / *.data dir
#      (s/<version>\./<clean>./); the version is used as an unescaped sed regex, as in the anchor
#   4. rm the original wheel, then python -m wheel pack --dest-dir dist <dir> (re-zips the whole
#      wheel with deflate and regenerates RECORD)
# Usage: wheel_pack.sh DIST_DIR   (PYTHON selects the interpreter; default python3)
set -euo pipefail

strip_wheel_local_version() {
  local dist="${1:-dist}"
  local python="${PYTHON:-python3}"
  local whl tmp root meta version clean new_root d
  shopt -s nullglob
  for whl in "$dist"/*.whl; do
    case "$(basename "$whl")" in
      *+*) ;;
      *) continue ;;
    esac
    tmp="$(mktemp -d "${dist}/.unpack.XXXXXX")"
    "$python" -m wheel unpack --dest "$tmp" "$whl"
    root="$(find "$tmp" -mindepth 1 -maxdepth 1 -type d | head -n1)"
    meta="$(ls "$root"/*.dist-info/METADATA)"
    version="$(sed -n 's/^Version: //p' "$meta" | head -n1)"
    clean="${version%%+*}"
    sed -i "s/^Version: ${version}\$/Version: ${clean}/" "$meta"
    new_root="$(echo "$root" | sed "s/${version}\$/${clean}/")"
    mv "$root" "$new_root"
    for d in "$new_root"/*.dist-info "$new_root"/*.data; do
      [ -e "$d" ] || continue
      mv "$d" "$(echo "$d" | sed "s/${version}\./${clean}./")"
    done
    rm -f "$whl"
    "$python" -m wheel pack --dest-dir "$dist" "$new_root"
    rm -rf "$tmp"
  done
}

strip_wheel_local_version "$@"
