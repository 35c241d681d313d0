/*
 * config.c -- build and runtime facts reported by fastattn.show_config(),
 * and the cache size the work units are planned for.
 */
#include "fastattn.h"
#include "fa_internal.h"

#if defined(__unix__) || defined(__APPLE__)
#include <unistd.h>
#endif

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

int64_t fa_l2_cache_bytes(void)
{
#if defined(_SC_LEVEL2_CACHE_SIZE)
    const long n = sysconf(_SC_LEVEL2_CACHE_SIZE);
    if (n > 0)
        return (int64_t)n;
#endif
    return (int64_t)1 << 20;
}
