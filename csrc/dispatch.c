/*
 * dispatch.c -- chooses the SIMD variant of the kernels once, from the CPU's
 * features or an explicit request (FASTATTN_SIMD, read by fastattn._core).
 */
#include "fa_kernels.h"

#include <string.h>

static const fa_kernel_table *fa_active = NULL;

static int fa_cpu_any(void)
{
    return 1;
}

#if defined(FA_HAVE_X86_VARIANTS)
/* 1 if this CPU (and OS) can run the AVX2 + FMA + F16C variant (every AVX2
 * CPU has F16C, which converts float16 k and v). */
static int fa_cpu_has_avx2(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")
           && __builtin_cpu_supports("f16c");
}

/* ... and the AVX-512 variant (which also runs the AVX2 code). */
static int fa_cpu_has_avx512(void)
{
    return fa_cpu_has_avx2() && __builtin_cpu_supports("avx512f")
           && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw")
           && __builtin_cpu_supports("avx512dq");
}
#endif

/* The variants of this build, from the portable one to the fastest: selection
 * by name, the automatic choice (the last this CPU runs), simd_available and
 * show_config all read this one list. */
static const struct {
    const fa_kernel_table *table;
    int (*runs_here)(void);
} fa_variants[] = {
    {&fa_kernels_generic, fa_cpu_any},
#if defined(FA_HAVE_X86_VARIANTS)
    {&fa_kernels_avx2, fa_cpu_has_avx2},
    {&fa_kernels_avx512, fa_cpu_has_avx512},
#endif
};
#define FA_NVARIANTS ((int)(sizeof fa_variants / sizeof fa_variants[0]))

static const fa_kernel_table *fa_best(void)
{
    int i;
    for (i = FA_NVARIANTS - 1; i > 0; i--)
        if (fa_variants[i].runs_here())
            return fa_variants[i].table;
    return fa_variants[0].table;
}

int fa_select_simd(const char *name)
{
    int i;
    if (name == NULL || name[0] == '\0' || strcmp(name, "auto") == 0) {
        fa_active = fa_best();
        return FA_OK;
    }
    for (i = 0; i < FA_NVARIANTS; i++)
        if (strcmp(name, fa_variants[i].table->name) == 0 && fa_variants[i].runs_here()) {
            fa_active = fa_variants[i].table;
            return FA_OK;
        }
    return FA_ERR_ARG; /* unknown, or not supported by this CPU or build */
}

const char *fa_simd_available(void)
{
    static char names[128]; /* written once, the same each time */
    size_t n = 0;
    int i;
    names[0] = '\0';
    for (i = 0; i < FA_NVARIANTS; i++) {
        const char *name = fa_variants[i].table->name;
        const size_t len = strlen(name);
        if (!fa_variants[i].runs_here() || n + len + 2 > sizeof names)
            continue;
        if (n > 0)
            names[n++] = ',';
        memcpy(names + n, name, len + 1);
        n += len;
    }
    return names;
}

const fa_kernel_table *fa_active_kernels(void)
{
    if (fa_active == NULL)
        fa_active = fa_best();
    return fa_active;
}

const char *fa_simd_kernel(void)
{
    return fa_active_kernels()->name;
}

int fa_tanh_f32(const float *x, float *y, int64_t n)
{
    if (n < 0 || (n > 0 && (!x || !y)))
        return FA_ERR_ARG;
    if (n > 0)
        fa_active_kernels()->tanh_array(x, y, n);
    return FA_OK;
}

int fa_exp2_f32(const float *x, float *y, int64_t n)
{
    if (n < 0 || (n > 0 && (!x || !y)))
        return FA_ERR_ARG;
    if (n > 0)
        fa_active_kernels()->exp2_array(x, y, n);
    return FA_OK;
}
