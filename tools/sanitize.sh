#!/usr/bin/env bash
# Build fastattn._core once with AddressSanitizer + UndefinedBehaviorSanitizer
# into a scratch copy of the package, and run the kernel-heavy tests against it
# on every SIMD path this CPU has. Any ASan/UBSan report aborts the run
# (-fno-sanitize-recover=all, halt_on_error=1), so a green run means zero reports.
#
#   tools/sanitize.sh                  # build + tests
#   SANITIZE_VALGRIND=1 tools/sanitize.sh   # also a valgrind memcheck smoke run
#
# Needs gcc with libasan/libubsan (gcc >= 7; Debian's gcc-12 ships them) and
# the test extra (pytest, hypothesis, scipy) in the running python.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/fastattn-asan.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

CC=${CC:-gcc}
LIBASAN=$($CC -print-file-name=libasan.so)
if [ ! -e "$LIBASAN" ]; then
    echo "sanitize: $CC has no libasan ($LIBASAN); install gcc's libasan (e.g. apt-get install libasan8)" >&2
    exit 1
fi

# The build needs pyproject.toml's build requirements in this python (pip's
# isolated build had them; a venv's own setuptools may be too old).
"$PY" -m pip install --quiet "Cython>=3.0" "setuptools>=77"

echo "== sanitize: building with -fsanitize=address,undefined into $WORK =="
# A scratch copy, so the in-place (non-sanitized) build of the checkout is untouched.
mkdir -p "$WORK/src"
cp -r setup.py pyproject.toml csrc "$WORK/"
cp -r src/fastattn "$WORK/src/"
rm -f "$WORK"/src/fastattn/_core*.so "$WORK"/src/fastattn/_core.c
SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all -g -O1"
# CC carries the sanitizer flags too, so that setup.py's OpenMP probe (an
# executable) links; a failed OpenMP probe stops the build.
(cd "$WORK" && CC="$CC -fsanitize=address,undefined" LDSHARED="$CC -shared -fsanitize=address,undefined" \
    CFLAGS="$SAN" \
    "$PY" setup.py -q build_ext --inplace >build.log 2>&1) || { cat "$WORK/build.log"; exit 1; }
SYMS=$(nm -D "$WORK"/src/fastattn/_core*.so)   # (not piped into grep -q: pipefail + SIGPIPE)
case "$SYMS" in *__asan_report*) ;; *) echo "sanitize: the core is not instrumented" >&2; exit 1;; esac
case "$SYMS" in *GOMP_parallel*) ;; *) echo "sanitize: the core was built without OpenMP" >&2; exit 1;; esac

export LD_PRELOAD="$LIBASAN"
# allocator_may_return_null: a request beyond memory (the tests ask for results of
# 2**62 bytes) returns NULL, as malloc does, for the callers' checks to see.
export ASAN_OPTIONS="detect_leaks=0:allocator_may_return_null=1:abort_on_error=1:halt_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
export PYTHONPATH="$WORK/src"
export HYPOTHESIS_PROFILE=fastattn-sanitize   # fewer examples (tests/conftest.py)

# Kernel-heavy tests; the Python-only ones (docstrings, CLI, errors) add nothing here.
TESTS=(tests/test_attention.py tests/test_softmax.py tests/test_masking.py tests/test_out.py
       tests/test_threads.py tests/test_simd.py
       tests/test_properties.py tests/test_concurrency.py
       tests/test_kv_dtypes.py tests/test_merge.py tests/test_decode_path.py tests/test_varlen.py
       tests/test_score_options.py tests/test_flash_attn.py tests/test_call_cost.py
       tests/test_layouts.py tests/test_errors_fuzzed.py tests/test_memory_safety.py
       tests/test_backward.py)

"$PY" -c "import fastattn, sys; c = fastattn.show_config(mode='dicts'); \
assert fastattn._core.__file__.startswith('$WORK'), fastattn._core.__file__; print(c)"
for path in $("$PY" -c "from fastattn import _core; print(' '.join(_core.simd_available()))"); do
    echo "== sanitize: tests on the $path kernels =="
    (cd "$ROOT" && FASTATTN_SIMD=$path "$PY" -m pytest -q -p no:cacheprovider -x "${TESTS[@]}")
done
echo "== sanitize: ASan+UBSan clean =="

if [ "${SANITIZE_VALGRIND:-0}" = "1" ]; then
    unset LD_PRELOAD ASAN_OPTIONS UBSAN_OPTIONS
    export PYTHONPATH="$ROOT/src"   # the ordinary in-place build
    echo "== valgrind memcheck smoke run (errors in fastattn's own code fail it) =="
    # PYTHONMALLOC=malloc: pymalloc's arena probing is a known valgrind false positive.
    # CPython itself (e.g. a pyenv build without valgrind support) reports errors of
    # its own; only error stacks through fastattn's core (_core*.so, csrc/) count.
    PYTHONMALLOC=malloc valgrind --tool=memcheck --leak-check=no --num-callers=30 \
        --log-file="$WORK/valgrind.log" "$("$PY" -c "import sys; print(sys.executable)")" tools/smoke.py
    grep "ERROR SUMMARY" "$WORK/valgrind.log"
    if grep -E "_core\.|csrc/|fa_[a-z_]+_f32" "$WORK/valgrind.log"; then
        echo "valgrind: errors in fastattn's core (above)" >&2
        exit 3
    fi
    echo "== valgrind: no error in fastattn's core =="
fi
