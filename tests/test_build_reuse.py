"""The build's parallel, reusing compile (setup.py): how many sources compile at
once, which files an object depends on, and that an object is compiled again
exactly when its source, a file it includes or its flags change.

Tiny C files in a temporary folder are compiled with the real compiler, so
this runs in a second or two. Needs the source tree's setup.py and a C
compiler; skipped where either is missing (the installed wheel tested from
outside the tree).
"""
import os
import sys
from pathlib import Path

import pytest

from conftest import C_COMPILER, ROOT, SETUP_PY, build_compiler

pytestmark = pytest.mark.skipif(not SETUP_PY.exists(), reason="needs the source tree's setup.py")
# the temporary sources are compiled with a unix compiler's flags
needs_cc = pytest.mark.skipif(C_COMPILER is None or sys.platform == "win32",
                              reason="needs a unix C compiler")


def test_build_jobs_env_then_parallel_then_cpus(setup_module_):
    jobs = setup_module_.build_jobs
    assert jobs(10, environ={"FASTATTN_BUILD_JOBS": "3"}) == 3
    assert jobs(2, environ={"FASTATTN_BUILD_JOBS": "8"}) == 2      # never more than the sources
    assert jobs(10, parallel=4, environ={"FASTATTN_BUILD_JOBS": "1"}) == 1
    assert jobs(10, parallel=4, environ={}) == 4                    # build_ext -j 4
    assert 1 <= jobs(10, environ={}) <= max(1, os.cpu_count() or 1)
    for bad in ("0", "-2", "two", "1.5"):
        with pytest.raises(SystemExit, match="FASTATTN_BUILD_JOBS"):
            jobs(10, environ={"FASTATTN_BUILD_JOBS": bad})


def test_included_files_follows_the_kernels_includes(setup_module_):
    found = setup_module_.included_files(str(ROOT / "csrc" / "kernels_avx512.c"),
                                         [str(ROOT / "csrc")])
    names = {Path(path).name for path in found}
    # kernels_avx512.c includes vec_math.h, x86_rows.h (which includes
    # x86_lanes8.h) and driver.inc (which includes the operations' files);
    # fa_kernels.h includes variants.def, fastattn.h dtypes.h
    assert {"kernels_avx512.c", "vec_avx512.h", "vec_math.h", "x86_rows.h", "x86_lanes8.h",
            "driver.inc", "unit_common.inc", "op_sdpa.inc", "op_weights.inc", "microkernels.h",
            "fa_internal.h", "fa_kernels.h", "fastattn.h", "variants.def", "dtypes.h"} <= names
    assert "kernels_avx2.c" not in names  # no kernel file includes another
    assert "immintrin.h" not in names  # the compiler's own headers are not followed


@needs_cc
def test_objects_are_kept_until_source_include_or_flags_change(setup_module_, tmp_path,
                                                                monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    Path("src").mkdir()
    Path("src/shared.h").write_text("#define VALUE 1\n")
    Path("src/body.inc").write_text("int b(void) { return VALUE; }\n")
    Path("src/a.c").write_text('#include "shared.h"\nint a(void) { return VALUE; }\n')
    Path("src/b.c").write_text('#include "shared.h"\n#include "body.inc"\n')
    Path("src/c.c").write_text("int c(void) { return 3; }\n")
    sources = ["src/a.c", "src/b.c", "src/c.c"]
    compiler = build_compiler()
    setup_module_.parallel_reusing_compile(compiler, jobs=2)

    def build(flags=("-O1",)):
        capsys.readouterr()
        objects = compiler.compile(sources, output_dir="build", include_dirs=["src"],
                                   extra_postargs=list(flags))
        assert all(os.path.isfile(obj) for obj in objects)
        stamps = {source: os.stat(obj).st_mtime_ns for source, obj in zip(sources, objects)}
        return stamps, capsys.readouterr().out

    first, out = build()
    assert "compiling 3 of 3 sources, 2 at a time" in out
    again, out = build()
    assert again == first and "compiling" not in out and "objects kept" in out

    Path("src/body.inc").write_text("int b(void) { return VALUE + 1; }\n")  # b.c's include
    after_inc, out = build()
    assert "compiling 1 of 3" in out
    assert [s for s in sources if after_inc[s] != again[s]] == ["src/b.c"]

    Path("src/shared.h").write_text("#define VALUE 2\n")  # a.c's and b.c's
    after_header, out = build()
    assert [s for s in sources if after_header[s] != after_inc[s]] == ["src/a.c", "src/b.c"]

    after_flags, out = build(("-O2",))  # a flag (as FASTATTN_DISABLE_OPENMP=1 drops -fopenmp)
    assert "compiling 3 of 3" in out
    assert all(after_flags[s] != after_header[s] for s in sources)


@needs_cc
def test_a_failed_compile_leaves_no_key(setup_module_, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("good.c").write_text("int good(void) { return 0; }\n")
    Path("bad.c").write_text("int bad(void) { return }\n")
    compiler = build_compiler()
    setup_module_.parallel_reusing_compile(compiler, jobs=2)
    with pytest.raises(Exception):
        compiler.compile(["good.c", "bad.c"], output_dir="build")
    assert not list(Path("build").glob("bad*.key"))
    Path("bad.c").write_text("int bad(void) { return 1; }\n")
    objects = compiler.compile(["good.c", "bad.c"], output_dir="build")
    assert all(os.path.isfile(obj + ".key") for obj in objects)

