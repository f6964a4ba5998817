/* avx512 matmul tiles (filled in below when built with the avx512 flags of setup.py). */
#include "matmul.h"

#if 0
const int mm_avx512_built = 1;
#else
const int mm_avx512_built = 0;
const mm_tile_fn mm_tiles_avx512[MM_KINDS] = {0};
#endif
