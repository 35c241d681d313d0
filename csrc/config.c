/*
 * config.c -- build and runtime facts reported by fastattn.show_config().
 */
#include "fastattn.h"
#include "fa_internal.h"

int fa_built_with_openmp(void)
{
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

int fa_omp_max_threads(void)
{
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

#define FA_STR2(x) #x
#define FA_STR(x) FA_STR2(x)

const char *fa_compiler(void)
{
#if defined(__clang__)
    return "clang " __clang_version__;
#elif defined(__GNUC__)
    return "gcc " __VERSION__;
#elif defined(_MSC_VER)
    return "msvc " FA_STR(_MSC_FULL_VER);
#else
    return "unknown C compiler";
#endif
}
