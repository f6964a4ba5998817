/* avx2 matmul tiles (filled in below when built with the avx2 flags of setup.py). */
#include "matmul.h"

#if 0
const int mm_avx2_built = 1;
#else
const int mm_avx2_built = 0;
const mm_tile_fn mm_tiles_avx2[MM_KINDS] = {0};
#endif
