#!/usr/bin/env bash
# Runs fastattn on aarch64 from an x86-64 Linux host, under emulation
# (qemu-user), on every kernel variant that an aarch64 build has: "generic"
# in every build, plus each variant that csrc/variants.def marks ARM64. A
# variant of arch ANY or ARM64 that the build lacks is a failure, so a new
# aarch64 variant is run (and required) as soon as its line is there.
#   1. The C kernel driver (tests/c/kernel_driver.c linked with every
#      csrc/*.c), cross-built with aarch64-linux-gnu-gcc and run with
#      qemu-aarch64: each variant against double precision, three threads
#      against one, the variants against each other.
#   2. fastattn._core cross-built (Cython on the host, setup.py's sources and
#      flags) against Debian bookworm's arm64 CPython 3.11, and a subset of
#      the Python suite run by that Python, emulated, once per variant
#      (FASTATTN_SIMD=<name>). Python's subprocesses (sys.executable) are
#      emulated too.
# The arm64 CPython, NumPy, SciPy, pytest, hypothesis and threadpoolctl are
# Debian packages unpacked with dpkg-deb -x into a sysroot (nothing is
# installed on the host): an apt-get of their own (its own sources list,
# state and cache, architecture arm64) resolves their dependencies and
# downloads them from the Debian mirror, checked against the archive's key.
#
# usage: tools/aarch64_check.sh [pytest arguments...]
#   Default pytest arguments: the subset below, chosen to keep the whole run
#   (the installs on a fresh machine included) well within five minutes with
#   a few variants: about 50 s a variant, and 40 s to build on a cold start.
#   `tools/aarch64_check.sh tests` runs the whole suite (about a quarter of
#   an hour a variant). The tests are copied from this tree and run from a
#   temporary folder. The C driver runs every variant; pytest runs every
#   variant but generic (the portable C that every x86 stage tests too, and
#   the C driver here), unless FASTATTN_AARCH64_PYTEST names the variants
#   (e.g. "generic neon").
# Needs a Debian or Ubuntu host (apt-get, dpkg-deb) with network access.
# Installs gcc-aarch64-linux-gnu, libc6-dev-arm64-cross and qemu-user with
# apt-get when they are missing (as root). Cython comes from python3 when it
# has it, else from a virtual environment made in build/aarch64/.
# Caches in build/aarch64/: the sysroot (keyed by its package list, mirror
# and the code below that makes it) and the built extension (keyed by every
# input of its build), so a second run builds nothing it has.
# Environment: FASTATTN_DEBIAN_MIRROR (default http://deb.debian.org/debian)
# and FASTATTN_DEBIAN_SECURITY (default http://deb.debian.org/debian-security).
set -euo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
CACHE=$HERE/build/aarch64
MIRROR=${FASTATTN_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY=${FASTATTN_DEBIAN_SECURITY:-http://deb.debian.org/debian-security}
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
JOBS=$(nproc 2>/dev/null || echo 2)

if [ "$#" -eq 0 ]; then
    # What tells the kernel variants apart: selection (FASTATTN_SIMD in an
    # emulated subprocess too), the exponentials and tanh against float64,
    # the whole-tile kernels at D = 64 and 72 (test_simd.py); attention and
    # the softmax family on them (test_attention.py, test_softmax.py);
    # float16 k and v (test_kv_dtypes.py; bfloat16 needs ml_dtypes, which
    # bookworm has no package of: those skip); the few-rows decoding kernels
    # against the general path (test_decode_path.py); inputs at any byte
    # address (test_layouts.py). Left out, as each takes seconds under
    # emulation: the thread counts, the score options, decoding over many key
    # chunks and the larger problems, whose cases the C driver above runs on
    # each variant (three threads against one included);
    slow=(working_memory "whole_tile and (1100 or 16 or 128)" half_kv_grouped_query_heads
          decode_rows_have_the_bits_of_a_prefill units_that_copy_their_value_tiles
          c_contiguous_float32_inputs_are_used_in_place blhd_views_make_no_copy)
    # and the tests that use numpy.exceptions, which NumPy 1.25 added
    # (Debian bookworm's NumPy is 1.24).
    numpy125=(axis_out_of_range zero_d_input_axis_error)
    k=
    for name in "${slow[@]}" "${numpy125[@]}"; do
        k="$k${k:+ and }not ($name)"
    done
    set -- tests/test_simd.py tests/test_attention.py tests/test_softmax.py tests/test_kv_dtypes.py \
        tests/test_decode_path.py tests/test_layouts.py -k "$k"
fi

SECONDS=0
step() { echo; echo "== [$(printf '%3d' "$SECONDS") s] $*"; }

# ------------------------------------------------------------- host tools
step "host tools: aarch64-linux-gnu-gcc, qemu-aarch64"
for tool in apt-get dpkg-deb; do
    command -v "$tool" >/dev/null || { echo "$tool not found: this needs a Debian or Ubuntu host"; exit 1; }
done
missing=()
command -v aarch64-linux-gnu-gcc >/dev/null || missing+=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross)
command -v qemu-aarch64 >/dev/null || missing+=(qemu-user)
if [ "${#missing[@]}" -gt 0 ]; then
    [ "$(id -u)" -eq 0 ] || { echo "missing, install as root: apt-get install ${missing[*]}"; exit 1; }
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
[ -r "$KEYRING" ] || { echo "$KEYRING not found (apt-get install debian-archive-keyring)"; exit 1; }
CC=aarch64-linux-gnu-gcc
"$CC" --version | head -n 1
qemu-aarch64 --version | head -n 1

WORK=$(mktemp -d)
SHIM=
trap 'rm -rf "$WORK"; [ -z "$SHIM" ] || rm -f "$SHIM"' EXIT

# The variants an aarch64 build must have: those of arch ANY or ARM64 (the
# preprocessor reads the list as the build does, comments and all).
REQUIRED=$("$CC" -E -P -x c -D'FA_VARIANT(name,arch,runs_here)=@name arch@' "$HERE/csrc/variants.def" \
    | grep -o '@[A-Za-z0-9_]* \(ANY\|ARM64\)@' | sed -e 's/^@//' -e 's/ .*//' | tr '\n' ' ')
echo "variants an aarch64 build must have (csrc/variants.def, arch ANY or ARM64): $REQUIRED"
status=0
require_all() {  # require_all WHAT "available names": each of REQUIRED is there
    local name
    for name in $REQUIRED; do
        case " $2 " in
            *" $name "*) ;;
            *) echo "FAILED: $1 lacks the $name variant (has: $2)"; status=1 ;;
        esac
    done
}

compile_each() {  # compile_each OUTDIR FLAGS... -- SOURCES...: OUTDIR/<name>.o, $JOBS at a time
    local out=$1 flags=() src running=0 failed=0
    shift
    while [ "$1" != -- ]; do flags+=("$1"); shift; done
    shift
    for src in "$@"; do
        if [ "$running" -ge "$JOBS" ]; then
            wait -n || failed=1
            running=$((running - 1))
        fi
        "$CC" -c "${flags[@]}" "$src" -o "$out/$(basename "${src%.c}").o" &
        running=$((running + 1))
    done
    for ((; running > 0; running--)); do
        wait -n || failed=1
    done
    return "$failed"
}

# ------------------------------------------------------ 1. the C driver
step "the C kernel driver, cross-built, under qemu-aarch64"
# tests/test_kernel_driver.py's flags (setup.py's floating-point ones, -O2)
DRIVER_FLAGS=(-O2 -std=c99 -ffp-contract=off -fno-math-errno -fno-trapping-math -fopenmp)
mkdir "$WORK/driver"
if ! compile_each "$WORK/driver" "${DRIVER_FLAGS[@]}" -I "$HERE/csrc" -- "$HERE"/csrc/*.c "$HERE/tests/c/kernel_driver.c" \
    || ! "$CC" "${DRIVER_FLAGS[@]}" "$WORK"/driver/*.o -lm -o "$WORK/driver/kernel_driver"; then
    echo "FAILED: the C driver does not build for aarch64 (the compiler's output is above)"
    exit 1
fi
set +e
qemu-aarch64 -L /usr/aarch64-linux-gnu "$WORK/driver/kernel_driver" | tee "$WORK/driver/out"
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" -ne 0 ]; then
    echo "FAILED: kernel_driver exited with $rc"
    status=1
fi
# its first line: "kernel_driver: N variant(s): generic, ...; compiler ..."
require_all "the C driver's build" "$(head -n 1 "$WORK/driver/out" | sed -e 's/^[^:]*: [0-9]* variant(s): //' -e 's/;.*//' -e 's/,/ /g')"

# ------------------------------------------- 2a. the arm64 Python sysroot
# What the tests import, and the shared libraries those need. SciPy's own
# dependencies are named here and SciPy is downloaded alone: Debian's
# python3-scipy depends on pythran, a compiler (gcc, g++, Boost: 70 MB more)
# that scipy.special does not use.
PACKAGES=(python3.11 libpython3.11-dev python3-numpy python3-pytest python3-hypothesis
          python3-threadpoolctl libgomp1 python3-decorator libgfortran5 liblbfgsb0 libstdc++6)
ALONE=(python3-scipy)

make_sysroot() {  # make_sysroot DIR: unpack the packages into DIR
    local root=$1 apt=$1.apt deb
    mkdir -p "$root" "$apt"/{parts,sources.d,prefs.d,lists/partial,archives/partial}
    : > "$apt/status"  # nothing installed: every dependency is downloaded
    cat > "$apt/sources.list" <<EOF
deb [arch=arm64 signed-by=$KEYRING] $MIRROR bookworm main
deb [arch=arm64 signed-by=$KEYRING] $MIRROR bookworm-updates main
deb [arch=arm64 signed-by=$KEYRING] $SECURITY bookworm-security main
EOF
    # Read instead of the host's configuration (APT_CONFIG comes first and
    # points the rest away from /etc/apt): no host source, pin or hook.
    cat > "$apt/apt.conf" <<EOF
Dir::Etc::Main "/dev/null";
Dir::Etc::Parts "$apt/parts";
Dir::Etc::SourceList "$apt/sources.list";
Dir::Etc::SourceParts "$apt/sources.d";
Dir::Etc::Preferences "/dev/null";
Dir::Etc::PreferencesParts "$apt/prefs.d";
Dir::State "$apt";
Dir::State::Lists "$apt/lists";
Dir::State::status "$apt/status";
Dir::Cache "$apt";
Dir::Cache::Archives "$apt/archives";
APT::Architecture "arm64";
APT::Architectures { "arm64"; };
APT::Install-Recommends "false";
APT::Sandbox::User "root";
Debug::NoLocking "true";
EOF
    APT_CONFIG=$apt/apt.conf apt-get -qq update
    APT_CONFIG=$apt/apt.conf apt-get -qq -y --download-only install "${PACKAGES[@]}" >/dev/null
    (cd "$apt/archives" && APT_CONFIG=$apt/apt.conf apt-get -qq download "${ALONE[@]}")
    echo "$(find "$apt/archives" -name '*.deb' | wc -l) packages, $(du -sh "$apt/archives" | cut -f1)"
    for deb in "$apt"/archives/*.deb; do
        dpkg-deb -x "$deb" "$root"
    done
    # BLAS and LAPACK are found through update-alternatives' links, which
    # only the packages' install scripts make.
    ln -s blas/libblas.so.3 "$root/usr/lib/aarch64-linux-gnu/libblas.so.3"
    ln -s lapack/liblapack.so.3 "$root/usr/lib/aarch64-linux-gnu/liblapack.so.3"
    rm -rf "$apt"
}

SYSROOT_KEY=$( { printf '%s\n' "$MIRROR" "$SECURITY" "${PACKAGES[@]}" -- "${ALONE[@]}"; declare -f make_sysroot; } \
    | sha256sum | cut -c1-16)
SYSROOT=$CACHE/sysroot-$SYSROOT_KEY
step "the arm64 sysroot (Debian bookworm packages, unpacked)"
if [ -e "$SYSROOT/.complete" ]; then
    echo "kept: $SYSROOT"
else
    mkdir -p "$CACHE"
    rm -rf "$CACHE"/sysroot-*  # other package lists' sysroots, or a broken one
    make_sysroot "$SYSROOT"
    # Debian's packages come without bytecode (their install scripts
    # compile it). A host Python of the same version writes the same .pyc
    # files, natively: half a minute less for the first emulated run.
    if python3 -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
        python3 -m compileall -q -j 0 "$SYSROOT/usr/lib/python3.11" "$SYSROOT/usr/lib/python3/dist-packages" \
            >/dev/null 2>&1 || true  # (a few files of the packages' test data do not compile)
    fi
    touch "$SYSROOT/.complete"
    echo "made: $SYSROOT ($(du -sh "$SYSROOT" | cut -f1))"
fi
PY=$SYSROOT/usr/bin/python3.11

# -------------------------------------- 2b. fastattn._core for aarch64
step "fastattn._core cross-built for the arm64 CPython"
# Cython (and setuptools, to load setup.py) on the host
HOSTPY=python3
if ! "$HOSTPY" -c "import Cython, setuptools" 2>/dev/null; then
    HOSTPY=$CACHE/host-venv/bin/python
    if ! "$HOSTPY" -c "import Cython, setuptools" 2>/dev/null; then
        rm -rf "$CACHE/host-venv"
        python3 -m venv "$CACHE/host-venv"
        # pyproject.toml's build requirements
        mapfile -t requires < <(cd "$HERE" && "$HOSTPY" -c \
            'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"]))')
        "$HOSTPY" -m pip install --quiet "${requires[@]}"
    fi
fi
# The target Python's own compile and link flags (as a build on an arm64
# Debian gets them), then setup.py's (BuildExt's: later, so they win).
"$HOSTPY" - "$SYSROOT/usr/lib/python3.11/_sysconfigdata__aarch64-linux-gnu.py" > "$WORK/sysconfig" <<'PY'
import sys
scope = {}
with open(sys.argv[1]) as f:
    exec(f.read(), scope)
var = scope["build_time_vars"]
print(var["EXT_SUFFIX"], var["CFLAGS"] + " " + var["CCSHARED"], " ".join(var["LDSHARED"].split()[1:]),
      sep="\n")
PY
{ read -r EXT_SUFFIX; read -r -a PY_CFLAGS; read -r -a PY_LDFLAGS; } < "$WORK/sysconfig"
CORE_FLAGS=(-O3 -std=c99 -ffp-contract=off -fno-math-errno -fno-trapping-math -Wall -Wextra
            -Wno-unused-function -Wno-unreachable-code -fopenmp)
# (-idirafter: Debian's pyconfig.h includes <aarch64-linux-gnu/python3.11/pyconfig.h>;
# the C library's headers stay the cross compiler's own)
INCLUDES=(-I "$HERE/csrc" -I "$SYSROOT/usr/include/python3.11"
          -I "$SYSROOT/usr/lib/python3/dist-packages/numpy/core/include" -idirafter "$SYSROOT/usr/include")

# A copy of the package, where Cython writes its C: nothing is written into src/.
mkdir "$WORK/pkg" "$WORK/obj"
cp -r "$HERE/src/fastattn" "$WORK/pkg/"
find "$WORK/pkg" \( -name '*.so' -o -name '_core.c' -o -name '__pycache__' \) -prune -exec rm -rf {} +
# setup.py's sources (its SOURCES, with the copy's .pyx), Cython run with
# its directives when the extension is to be built
cat > "$WORK/setup_sources.py" <<'PY'
import importlib.util, sys
spec = importlib.util.spec_from_file_location("fastattn_setup", "setup.py")
setup = importlib.util.module_from_spec(spec)
spec.loader.exec_module(setup)  # (its setup() runs only as __main__)
pyx, build_base, cythonize = sys.argv[1], sys.argv[2], sys.argv[3] == "cythonize"
print("\n".join(pyx if source == "src/fastattn/_core.pyx" else source for source in setup.SOURCES))
if cythonize:
    from setuptools import Extension
    setup.cythonize_once(Extension("fastattn._core", sources=[pyx]), build_base, force=True)
PY
(cd "$HERE" && "$HOSTPY" "$WORK/setup_sources.py" "$WORK/pkg/fastattn/_core.pyx" "$WORK" list) > "$WORK/sources"
mapfile -t CORE_SOURCES < "$WORK/sources"
CORE_KEY=$( { "$CC" --version; "$HOSTPY" -c "import Cython; print(Cython.__version__)"
              printf '%s\n' "$SYSROOT_KEY" "$EXT_SUFFIX" "${PY_CFLAGS[@]}" "${PY_LDFLAGS[@]}" "${CORE_FLAGS[@]}"
              printf '%s\n' "${CORE_SOURCES[@]}" | sed -e "s:^$WORK/::"
              cd "$HERE" && find setup.py csrc src/fastattn -type f \( -name setup.py -o -path 'csrc/*' \
                  -o -name '*.pyx' -o -name '*.pxd' \) -print0 | sort -z | xargs -0 tail -n +1; } \
    | sha256sum | cut -c1-16)
CORE=$CACHE/core-$CORE_KEY/_core$EXT_SUFFIX
if [ -e "$CORE" ]; then
    echo "kept: $CORE"
else
    rm -rf "$CACHE"/core-*
    (cd "$HERE" && "$HOSTPY" "$WORK/setup_sources.py" "$WORK/pkg/fastattn/_core.pyx" "$WORK" cythonize >/dev/null)
    C_SOURCES=()
    for source in "${CORE_SOURCES[@]}"; do
        case $source in
            /*) C_SOURCES+=("${source%.pyx}.c") ;;
            *) C_SOURCES+=("$HERE/$source") ;;
        esac
    done
    mkdir -p "$CACHE/core-$CORE_KEY.tmp"
    if ! compile_each "$WORK/obj" "${PY_CFLAGS[@]}" "${CORE_FLAGS[@]}" "${INCLUDES[@]}" -- "${C_SOURCES[@]}" \
        || ! "$CC" "${PY_LDFLAGS[@]}" -fopenmp "$WORK"/obj/*.o -o "$CACHE/core-$CORE_KEY.tmp/_core$EXT_SUFFIX"; then
        echo "FAILED: fastattn._core does not build for aarch64 (the compiler's output is above)"
        exit 1
    fi
    mv "$CACHE/core-$CORE_KEY.tmp" "$CACHE/core-$CORE_KEY"
    echo "made: $CORE"
fi
cp "$CORE" "$WORK/pkg/fastattn/"

# --------------------------------------- 2c. the suite, emulated Python
cp -r "$HERE/tests" "$HERE/examples" "$WORK/"
cd "$WORK"
# A python that runs itself under qemu, beside the real one so that it finds
# its prefix (the sysroot's /usr) from its own path, and named so that
# sys.executable (and every subprocess the tests start) is emulated too:
# qemu-user's binfmt_misc registration cannot be relied on.
SHIM=$SYSROOT/usr/bin/python3.11-qemu
# shellcheck disable=SC2016  # ($0 and $@ are the shim's own)
printf '#!/bin/sh\nexec qemu-aarch64 -L "%s" -0 "$0" "%s" "$@"\n' "$SYSROOT" "$PY" > "$SHIM"
chmod +x "$SHIM"
# The emulated Python sees the host's environment: none of the host's own
# Python settings, no user site; the package built above first. The
# bytecode the host did not compile (all of it when the host's Python is not
# 3.11) this Python writes into the sysroot as it imports, once.
unset PYTHONHOME VIRTUAL_ENV PYTHONDONTWRITEBYTECODE PYTHONSTARTUP
export PYTHONNOUSERSITE=1
export PYTHONPATH=$WORK/pkg:$SYSROOT/usr/lib/python3/dist-packages

step "the emulated Python: which kernels it has"
"$SHIM" - "$WORK/available" <<'PY'
import platform, sys
import numpy
import fastattn
from fastattn import _core
print(f"platform.machine(): {platform.machine()}; Python {platform.python_version()}; "
      f"NumPy {numpy.__version__}; sys.executable: {sys.executable}")
fastattn.show_config()
print("_core.simd_available():", ", ".join(_core.simd_available()))
assert platform.machine() == "aarch64", platform.machine()
with open(sys.argv[1], "w") as f:
    f.write(" ".join(_core.simd_available()))
PY
AVAILABLE=$(cat "$WORK/available")
require_all "the Python build" "$AVAILABLE"

# pytest in the process that checked the machine and the variant (an
# emulated start less). The tests that take the `simd` fixture run once per
# variant within one run; here each run keeps the variant it is for, so the
# time grows with the number of variants, not with its square.
cat > "$WORK/run_pytest.py" <<'PY'
import os, platform, sys
import fastattn
from fastattn import _core
want = os.environ["FASTATTN_SIMD"]
config = fastattn.show_config(mode="dicts")
print(f"platform.machine(): {platform.machine()}; FASTATTN_SIMD={want}: selected {config['simd']}; "
      f"available: {', '.join(_core.simd_available())}", flush=True)
if platform.machine() != "aarch64" or config["simd"] != want:
    sys.exit("FAILED: not the machine or the variant asked for")
import pytest


class ThisVariantOnly:
    def pytest_collection_modifyitems(self, config, items):
        other = [item for item in items if hasattr(item, "callspec")
                 and item.callspec.params.get("simd", want) != want]
        if other:
            config.hook.pytest_deselected(items=other)
            dropped = set(map(id, other))
            items[:] = [item for item in items if id(item) not in dropped]


sys.exit(pytest.main(sys.argv[1:], plugins=[ThisVariantOnly()]))
PY
PYTEST_VARIANTS=${FASTATTN_AARCH64_PYTEST:-$(echo "$AVAILABLE" | tr ' ' '\n' | { grep -vx generic || true; } | tr '\n' ' ')}
for variant in $PYTEST_VARIANTS; do
    step "pytest on aarch64, the $variant kernels (FASTATTN_SIMD=$variant): $*"
    start=$SECONDS
    if ! FASTATTN_SIMD=$variant "$SHIM" run_pytest.py -q -p no:cacheprovider "$@"; then
        echo "FAILED: tests on the $variant kernels"
        status=1
    fi
    echo "($variant: $((SECONDS - start)) s)"
done
step "done: $([ "$status" -eq 0 ] && echo passed || echo FAILED)"
exit $status
