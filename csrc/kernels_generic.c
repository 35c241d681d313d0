/* The portable kernels: C99 for the build's baseline instruction set. */
#define FA_NAME(x) x##_generic
#define FA_VARIANT_NAME "generic"
#define FA_MR 4
#include "kernels.inc"
