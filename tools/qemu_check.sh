#!/usr/bin/env bash
# Runs fastattn's tests on emulated x86-64 CPUs (qemu-user), to prove that the
# kernel path is chosen from the CPU at import and that the build runs on CPUs
# older than the build machine:
#   -cpu Nehalem   SSE4.2, no AVX at all     -> must select "generic"
#   -cpu Haswell   AVX2 + FMA, no AVX-512    -> must select "avx2"
# Each CPU also checks the FASTATTN_SIMD override (a path the CPU lacks is
# refused with a warning; "generic" is always honoured).
#
# usage: tools/qemu_check.sh VENV [pytest arguments...]
#   VENV: a virtual environment with fastattn and its test extra installed
#   (e.g. .venv-wheel, made by .ci/run from the repaired wheel). The tests are
#   copied from this tree and run from a temporary folder, so the installed
#   package is what runs. Default pytest arguments: the whole suite, quietly.
# Needs qemu-x86_64 (Debian: apt-get install qemu-user) on an x86-64 Linux host.
# Python's subprocesses (sys.executable) run on the same emulated CPU.
set -euo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
VENV=$(cd "${1:?usage: tools/qemu_check.sh VENV [pytest arguments...]}" && pwd)
shift
[ "$#" -gt 0 ] || set -- tests
command -v qemu-x86_64 >/dev/null || { echo "qemu-x86_64 not found (apt-get install qemu-user)"; exit 1; }
qemu-x86_64 --version | head -n 1

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"; rm -f "$VENV"/bin/python-qemu-*' EXIT
cp -r "$HERE/tests" "$HERE/examples" "$WORK/"
cd "$WORK"

status=0
# qemu warns about the CPUID bits of a model that TCG cannot emulate (TSX,
# INVPCID on Haswell): noise here, filtered out.
quiet() { "$@" 2> >(grep -v "TCG doesn't support requested feature" >&2); }
for spec in Nehalem:generic Haswell:avx2; do
    cpu=${spec%%:*}
    want=${spec#*:}
    # A python that runs itself under qemu, named so that sys.executable (and
    # so every subprocess the tests start) is this emulated python too.
    shim="$VENV/bin/python-qemu-$cpu"
    printf '#!/bin/sh\nexec qemu-x86_64 -cpu %s -0 "$0" "%s" "$@"\n' "$cpu" "$VENV/bin/python" > "$shim"
    chmod +x "$shim"
    echo
    echo "== qemu-x86_64 -cpu $cpu: expecting the $want kernels"
    start=$SECONDS
    if ! quiet "$shim" - "$want" <<'PY'
import os, subprocess, sys
import fastattn
from fastattn import _core
want = sys.argv[1]
config = fastattn.show_config(mode='dicts')
print(f"selected: {config['simd']}; available: {', '.join(_core.simd_available())}; "
      f"compiler: {config['compiler']}; openmp runtime: "
      f"{(config['openmp_runtime'] or {}).get('filepath')}")
assert config["simd"] == want, f"selected {config['simd']}, expected {want}"
code = "import fastattn; print(fastattn.show_config(mode='dicts')['simd'])"
for request, expect in (("generic", "generic"), ("avx2", want)):
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ, FASTATTN_SIMD=request), check=True)
    got = res.stdout.strip()
    warned = "FASTATTN_SIMD ignored" in res.stderr
    print(f"FASTATTN_SIMD={request}: {got}" + (" (refused with a warning)" if warned else ""))
    assert got == expect and warned == (expect != request), (request, got, res.stderr)
PY
    then
        echo "FAILED: kernel selection on $cpu"
        status=1
        continue
    fi
    if ! quiet "$shim" -m pytest -q -p no:cacheprovider "$@"; then
        echo "FAILED: tests on $cpu"
        status=1
    fi
    echo "($cpu: $((SECONDS - start)) s)"
done
exit $status
