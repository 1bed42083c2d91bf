#!/usr/bin/env bash
# Fuzz targets for what reads untrusted bytes: the safetensors header parser, the dcp metadata
# decoder, and a whole checkpoint (metadata and data files) loaded and verified. Built with clang++ (-fsanitize=fuzzer,address,undefined) into
# OUT, independently of the main (g++) build; rebuilt only when a source changed.
#
#   scripts/fuzz.sh regress OUT          # each target over its seeds, then 200,000 mutations
#                                        # with a fixed seed (deterministic; seconds; ctest)
#   scripts/fuzz.sh run OUT [SECONDS]    # each target fuzzed for SECONDS (default 60; make fuzz)
#
# Exits 77 (ctest: skipped) when clang++ or its fuzzer runtime is not installed.
set -euo pipefail

mode=${1:?usage: fuzz.sh regress|run OUT [SECONDS]}
out=${2:?usage: fuzz.sh regress|run OUT [SECONDS]}
seconds=${3:-60}
REGRESS_RUNS=${FUZZ_REGRESS_RUNS:-200000}
root=$(cd "$(dirname "$0")/.." && pwd)
CXX=${FUZZ_CXX:-clang++}

if ! command -v "$CXX" >/dev/null 2>&1; then
  echo "fuzz: $CXX not found: skipped (install clang and libclang-rt-14-dev)"
  exit 77
fi
mkdir -p "$out"
probe="$out/probe.cc"
echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' >"$probe"
if ! "$CXX" -fsanitize=fuzzer,address "$probe" -o "$out/probe" 2>/dev/null; then
  echo "fuzz: $CXX cannot link -fsanitize=fuzzer: skipped (install libclang-rt-14-dev)"
  exit 77
fi

FLAGS=(-std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
       -I"$root/include" -I"$root/src")
CORE=(src/core/dtype.cc src/core/box.cc src/core/status.cc)
declare -A SOURCES=(
  [safetensors_header]="fuzz/safetensors_header_fuzz.cc src/hf/safetensors_header.cc src/hf/torch_hf_format.cc src/storage/posix_file_system.cc src/storage/posix_cas.cc src/storage/remove_tree.cc ${CORE[*]}"
  [metadata]="fuzz/metadata_fuzz.cc src/metadata/codec.cc src/metadata/metadata.cc src/core/checksum.cc ${CORE[*]}"
)
# Everything a load and a verify run through, but the S3 backend and MPI.
LOAD=$(cd "$root" && ls src/core/*.cc src/metadata/*.cc src/planner/*.cc src/storage/*.cc \
         src/comm/*.cc src/checkpoint/*.cc src/hf/*.cc |
       grep -v -e '_test\.cc$' -e file_system_for.cc -e checkpoint/api.cc | tr '\n' ' ')
SOURCES[checkpoint]="fuzz/checkpoint_fuzz.cc $LOAD"
declare -A LIBS=([safetensors_header]="" [metadata]="-lxxhash" [checkpoint]="-lxxhash -lpthread")
TARGETS=(safetensors_header metadata checkpoint)

build() {
  local t=$1 bin="$out/${1}_fuzz" stale=0
  local srcs=() s
  for s in ${SOURCES[$t]}; do srcs+=("$root/$s"); done
  if [ ! -x "$bin" ]; then
    stale=1
  else
    # Rebuild when any source or any header under include/ or src/ is newer than the binary.
    if [ -n "$(find "${srcs[@]}" "$root/include" "$root/src" -name '*.h' -newer "$bin" -o \
                 \( -name '*.cc' -newer "$bin" \) 2>/dev/null | head -1)" ]; then
      stale=1
    fi
  fi
  if [ $stale = 1 ]; then
    echo "fuzz: building $bin"
    # shellcheck disable=SC2086
    "$CXX" "${FLAGS[@]}" "${srcs[@]}" ${LIBS[$t]} -o "$bin.tmp"
    mv "$bin.tmp" "$bin"
  fi
}

for t in "${TARGETS[@]}"; do build "$t"; done

case "$mode" in
  regress)
    for t in "${TARGETS[@]}"; do
      echo "fuzz: $t over fuzz/corpus/$t"
      "$out/${t}_fuzz" "$root/fuzz/corpus/$t"/* 2>&1 | tail -n 2
      # Then a short fuzzing run that is the same every time (fixed seed, fixed run count,
      # a fresh scratch corpus): a regression test, never a flaky one.
      rm -rf "$out/regress/$t" && mkdir -p "$out/regress/$t"
      echo "fuzz: $t, $REGRESS_RUNS mutations (-seed=1)"
      "$out/${t}_fuzz" -seed=1 -runs="$REGRESS_RUNS" -artifact_prefix="$out/${t}-" \
        "$out/regress/$t" "$root/fuzz/corpus/$t" 2>&1 | tail -n 1
    done
    ;;
  run)
    for t in "${TARGETS[@]}"; do
      # New inputs go to a scratch corpus, not the seeds in the repository.
      mkdir -p "$out/corpus/$t"
      echo "fuzz: $t for ${seconds}s"
      "$out/${t}_fuzz" -max_total_time="$seconds" -print_final_stats=1 \
        -artifact_prefix="$out/${t}-" "$out/corpus/$t" "$root/fuzz/corpus/$t"
    done
    ;;
  *)
    echo "usage: fuzz.sh regress|run OUT [SECONDS]" >&2
    exit 2
    ;;
esac
