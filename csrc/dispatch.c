/*
 * dispatch.c -- chooses the SIMD variant of the kernels once, from the CPU's
 * features or an explicit request (FASTATTN_SIMD, read by fastattn._core).
 */
#include "fa_kernels.h"

#include <string.h>

static const fa_kernel_table *fa_active = NULL;

/* 1 if this CPU (and OS) can run the AVX2 + FMA + F16C variant (every AVX2
 * CPU has F16C, which converts float16 k and v). */
static int fa_cpu_has_avx2(void)
{
#if defined(FA_HAVE_X86_VARIANTS)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")
           && __builtin_cpu_supports("f16c");
#else
    return 0;
#endif
}

static const fa_kernel_table *fa_best(void)
{
#if defined(FA_HAVE_X86_VARIANTS)
    if (fa_cpu_has_avx2())
        return &fa_kernels_avx2;
#endif
    return &fa_kernels_generic;
}

int fa_select_simd(const char *name)
{
    if (name == NULL || name[0] == '\0' || strcmp(name, "auto") == 0) {
        fa_active = fa_best();
        return FA_OK;
    }
    if (strcmp(name, "generic") == 0) {
        fa_active = &fa_kernels_generic;
        return FA_OK;
    }
#if defined(FA_HAVE_X86_VARIANTS)
    if (strcmp(name, "avx2") == 0 && fa_cpu_has_avx2()) {
        fa_active = &fa_kernels_avx2;
        return FA_OK;
    }
#endif
    return FA_ERR_ARG; /* unknown, or not supported by this CPU or build */
}

const char *fa_simd_available(void)
{
    return fa_cpu_has_avx2() ? "generic,avx2" : "generic";
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
