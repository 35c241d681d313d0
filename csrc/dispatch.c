/*
 * dispatch.c -- chooses the SIMD variant of the kernels once, from the CPU's
 * features or an explicit request (FASTATTN_SIMD, read by fastattn._core).
 */
#include "fa_kernels.h"

#include <string.h>

static const fa_kernel_table *fa_active = NULL;

/* The variants this build compiles (variants.def): ANY in every build, X86
 * and ARM64 where fa_kernels.h defines FA_HAVE_X86_VARIANTS or
 * FA_HAVE_ARM64_VARIANTS. */
#define FA_IF_ANY(x) x
#if defined(FA_HAVE_X86_VARIANTS)
#define FA_IF_X86(x) x
#else
#define FA_IF_X86(x)
#endif
#if defined(FA_HAVE_ARM64_VARIANTS)
#define FA_IF_ARM64(x) x
#else
#define FA_IF_ARM64(x)
#endif

/* CPU features by name: the x86 variants' tests (gcc's and clang's
 * __builtin_cpu_supports reads CPUID there; not every compiler has it for
 * other architectures, whose variants need no test). */
#if defined(FA_HAVE_X86_VARIANTS)
#define FA_CPU(feature) __builtin_cpu_supports(feature)
#define FA_CPU_INIT() __builtin_cpu_init()
#else
#define FA_CPU(feature) 0
#define FA_CPU_INIT() ((void)0)
#endif

/* One test a variant: does this CPU (and OS) run it. */
#define FA_VARIANT(name, arch, runs_here)                                                          \
    FA_IF_##arch(static int fa_runs_##name(void) { FA_CPU_INIT(); return runs_here; })
#include "variants.def"
#undef FA_VARIANT

/* The variants of this build, from the portable one to the fastest: selection
 * by name, the automatic choice (the last this CPU runs), simd_available and
 * show_config all read this one list. */
static const struct {
    const fa_kernel_table *table;
    int (*runs_here)(void);
} fa_variants[] = {
#define FA_ROW(name) {&fa_kernels_##name, fa_runs_##name},
#define FA_VARIANT(name, arch, runs_here) FA_IF_##arch(FA_ROW(name))
#include "variants.def"
#undef FA_VARIANT
#undef FA_ROW
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
