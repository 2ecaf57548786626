#!/usr/bin/env bash
# Checks that every shipped binary needs no glibc newer than a floor: the highest GLIBC_x.y
# symbol version in `objdump -T` of each ELF file given, or of each ELF file inside each wheel
# given. For a wheel whose platform tag is manylinux_X_Y, also that nothing needs more than
# X.Y (the tag is true).
#
#   scripts/check_glibc_floor.sh [--max 2.28] FILE|WHEEL...
#
# Foreign-architecture files are read with <arch>-linux-gnu-objdump where the host's objdump
# does not know them, else with readelf (the version needs, which is the same list).
set -euo pipefail

max=2.28
if [ "${1:-}" = "--max" ]; then
  max=$2
  shift 2
fi
[ $# -gt 0 ] || { echo "usage: $0 [--max X.Y] FILE|WHEEL..." >&2; exit 2; }

# Highest of the version numbers on stdin (one per line), empty when none.
highest() { sort -t. -k1,1n -k2,2n -k3,3n | tail -n1; }
# a <= b for dotted versions.
le() { [ "$(printf '%s\n%s\n' "$1" "$2" | highest)" = "$2" ]; }

# The GLIBC versions an ELF file's dynamic symbols carry, one per line.
glibc_versions() {
  local f=$1 out=""
  if out=$(objdump -T "$f" 2>/dev/null); then :
  else
    local machine
    machine=$(readelf -h "$f" | sed -n 's/^ *Machine: *//p')
    case "$machine" in
      *AArch64*) out=$(aarch64-linux-gnu-objdump -T "$f" 2>/dev/null || readelf -W --dyn-syms -V "$f") ;;
      *) out=$(readelf -W --dyn-syms -V "$f") ;;
    esac
  fi
  grep -o 'GLIBC_[0-9][0-9.]*[0-9]' <<<"$out" | sed 's/^GLIBC_//' | sort -u || true
}

# Undefined symbols that are neither weak nor versioned: linked against a glibc (or zig's glibc
# stubs) that lacks them, they are looked up by bare name at load time and fail on a glibc
# without them ("undefined symbol", the program does not start under BIND_NOW), whatever the
# version needs say. `gettid` linked against 2.17 stubs is one.
unversioned_strong() {
  (objdump -T "$1" 2>/dev/null || aarch64-linux-gnu-objdump -T "$1" 2>/dev/null || true) |
    awk '$0 ~ /\*UND\*/ && $2 != "w" && $0 !~ /(GLIBC|GCC|GLIBCXX|CXXABI)_[0-9]/ { print $NF }'
}

fail=0
check_file() { # FILE LIMIT SHOWN-NAME
  local f=$1 limit=$2 name=$3 top bare
  bare=$(unversioned_strong "$f")
  if [ -n "$bare" ]; then
    echo "FAIL  $name: undefined symbols with no version, not weak (absent from the glibc it was linked against?):" $bare >&2
    fail=1
  fi
  top=$(glibc_versions "$f" | highest)
  if [ -z "$top" ]; then
    echo "ok    $name: no GLIBC versions"
  elif le "$top" "$limit"; then
    echo "ok    $name: needs GLIBC_$top (limit $limit)"
  else
    echo "FAIL  $name: needs GLIBC_$top, above $limit:" >&2
    glibc_versions "$f" | while read -r v; do le "$v" "$limit" || echo "        GLIBC_$v" >&2; done
    # The symbols that pull them in.
    (objdump -T "$f" 2>/dev/null || true) | grep -E 'GLIBC_[0-9.]+' | awk -v lim="$limit" '
      { for (i = 1; i <= NF; i++) if ($i ~ /^\(?GLIBC_/) { v = $i; gsub(/[()]|GLIBC_/, "", v);
          split(v, a, "."); split(lim, b, ".");
          if (a[1] > b[1] || (a[1] == b[1] && a[2] + 0 > b[2] + 0)) print "        " $NF " @ GLIBC_" v } }' >&2
    fail=1
  fi
}

is_elf() { [ "$(head -c4 "$1" | od -An -c | tr -d ' ')" = '177ELF' ]; }

for arg in "$@"; do
  case "$arg" in
    *.whl)
      tmp=$(mktemp -d)
      python3 -m zipfile -e "$arg" "$tmp"
      limit=$max
      tag=$(basename "$arg" .whl | grep -o 'manylinux_[0-9]*_[0-9]*' | head -n1 || true)
      if [ -n "$tag" ]; then
        tagged=$(sed 's/manylinux_\([0-9]*\)_\([0-9]*\)/\1.\2/' <<<"$tag")
        le "$tagged" "$limit" && limit=$tagged
      elif basename "$arg" | grep -q 'manylinux2014'; then
        le 2.17 "$limit" && limit=2.17
      fi
      n=0
      while IFS= read -r -d '' f; do
        if is_elf "$f"; then
          check_file "$f" "$limit" "$(basename "$arg"):${f#"$tmp"/}"
          n=$((n + 1))
        fi
      done < <(find "$tmp" -type f -print0)
      rm -rf "$tmp"
      if [ "$n" -lt 2 ]; then
        echo "FAIL  $(basename "$arg"): $n ELF files (the CLI and the preload expected)" >&2
        fail=1
      fi
      ;;
    *)
      is_elf "$arg" || { echo "FAIL  $arg: not an ELF file" >&2; fail=1; continue; }
      check_file "$arg" "$max" "$arg"
      ;;
  esac
done
exit $fail
