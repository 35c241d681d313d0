/*
 * kernels_only.h -- for the measuring tools that build a kernel variant on
 * its own (loop_ceiling.c, decode_ceiling.c), without attention.c: the one
 * function of attention.c that the kernels call. The tools take no float
 * mask, so the float-mask tail cut (fa_zero_tail) keeps the span as it is.
 */
#ifndef FA_TOOLS_KERNELS_ONLY_H
#define FA_TOOLS_KERNELS_ONLY_H

int64_t fa_zero_tail(const fa_attn_args *a, const fa_unit *u, int64_t b, int64_t l, int64_t h,
                     fa_max_abs_fn max_abs)
{
    (void)max_abs;
    (void)a;
    (void)u;
    (void)b;
    (void)l;
    return h;
}

#endif
