#!/usr/bin/env bash
# Builds stand-in FFmpeg shared libraries so that streamrecon binaries built here (linked against
# the system FFmpeg: libavutil.so.57, libavcodec.so.59, ...) start on a machine with no FFmpeg,
# such as the GPU machine, where video decoding is never used.
#
#   scripts/gpu-ffmpeg-stubs.sh OUT_DIR ELF [ELF ...]
#   LD_LIBRARY_PATH=OUT_DIR ELF --help
#
# For every FFmpeg library an ELF needs (libav*, libsw*, libpostproc) it writes OUT_DIR/<soname>
# with the same soname and symbol version nodes (e.g. LIBAVUTIL_57), defining every symbol the
# ELFs import from it, so that binding at load time (Rust links with -z now) succeeds. A stub
# function prints its name to stderr and aborts; an imported data object is zero-filled.
# Works on stripped binaries (it reads only the dynamic sections). Needs readelf and gcc.
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 OUT_DIR ELF [ELF ...]" >&2
  exit 2
fi
out=$1
shift
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# FFmpeg's own libraries only: a bare ^lib(av|sw) would also take libavahi, libavif, ...
ffre='^lib(avutil|avcodec|avformat|avdevice|avfilter|avresample|swscale|swresample|postproc)[.]so'
# One line per need: "soname version type size symbol" ("-" where it does not apply).
for elf in "$@"; do
  if ! LC_ALL=C readelf -h "$elf" >/dev/null 2>&1; then
    echo "$0: $elf: not an ELF file" >&2
    exit 1
  fi
  {
    LC_ALL=C readelf -W -d "$elf"
    echo '@@VERSIONS@@'
    LC_ALL=C readelf -W -V "$elf"
    echo '@@DYNSYM@@'
    LC_ALL=C readelf -W --dyn-syms "$elf"
  } | awk -v re="$ffre" '
    $0 == "@@VERSIONS@@" { part = 1; next }
    $0 == "@@DYNSYM@@" { part = 2; next }
    part == 0 && /\(NEEDED\)/ {
      so = $0; sub(/.*\[/, "", so); sub(/\].*/, "", so)
      if (so ~ re) print so, "-", "-", "-", "-"
    }
    part == 1 && /^Version/ { vr = ($0 ~ /^Version needs section/); file = ""; next }
    part == 1 && vr && / File: / { for (i = 1; i < NF; i++) if ($i == "File:") file = $(i + 1) }
    part == 1 && vr && / Name: / && file ~ re {
      for (i = 1; i < NF; i++) if ($i == "Name:") { lib[$(i + 1)] = file; print file, $(i + 1), "-", "-", "-" }
    }
    # Imported (UND) symbols, and data copied into the executable (copy relocations), both
    # carry a version needed from the library: name@VERSION.
    part == 2 && $1 ~ /^[0-9]+:$/ && NF >= 8 && $8 ~ /@/ {
      name = $8; ver = $8; sub(/@.*/, "", name); sub(/^[^@]*@+/, "", ver)
      if (ver in lib) print lib[ver], ver, ($4 == "OBJECT" ? "OBJECT" : "FUNC"), $3, name
    }'
done | sort -u >"$tmp/needs"
if [ ! -s "$tmp/needs" ]; then
  echo "$0: none of the given files needs an FFmpeg library; nothing to do" >&2
  exit 0
fi
cut -d' ' -f1 "$tmp/needs" | sort -u >"$tmp/sonames"
while read -r so; do
  awk -v so="$so" -v c="$tmp/$so.c" -v m="$tmp/$so.map" '
    $1 != so { next }
    $2 != "-" && !($2 in node) { node[$2] = ""; order[++nn] = $2 }
    $5 == "-" || ($5 in ver) { next }
    { ver[$5] = $2; node[$2] = node[$2] "    " $5 ";\n"; nsym++
      if ($3 == "OBJECT") {
        size = ($4 + 0 > 0 || $4 ~ /^0x/) ? $4 : 8
        body = body "char " $5 "[" size "] __attribute__((aligned(16)));\n"
      } else body = body "void " $5 "(void) { stub_fail(\"" $5 "\"); }\n"
    }
    END {
      printf "extern int dprintf(int, const char *, ...);\n" \
             "extern void abort(void) __attribute__((noreturn));\n" \
             "static void stub_fail(const char *name) {\n" \
             "  dprintf(2, \"%%s: %%s called, but this is a stub (scripts/gpu-ffmpeg-stubs.sh): " \
             "FFmpeg is not installed on this machine\\n\", \"%s\", name);\n" \
             "  abort();\n}\n%s", so, body > c
      if (nn == 0) printf "{ local: *; };\n" > m
      for (i = 1; i <= nn; i++)
        printf "%s {\n  global:\n%s  local: *;\n};\n", order[i], node[order[i]] > m
      printf "%s: %d symbols, version nodes:", so, nsym
      for (i = 1; i <= nn; i++) printf " %s", order[i]
      printf "\n"
    }' "$tmp/needs"
  gcc -shared -fPIC -O1 -w -fno-builtin -Wl,-soname,"$so" -Wl,--version-script,"$tmp/$so.map" \
    -o "$out/$so" "$tmp/$so.c"
done <"$tmp/sonames"
echo "stubs written to $out; run with LD_LIBRARY_PATH=$out" >&2
