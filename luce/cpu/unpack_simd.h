/* AVX2 helpers shared by the AVX2 and AVX-512 tiles (both files are built with -mavx2):
 * SIMD unpacking of the hot block types into unpack.h's form (the same bytes as its scalar
 * loops), group scale vectors and the exact 8-way integer reduction. */
#ifndef LUCE_CPU_UNPACK_SIMD_H
#define LUCE_CPU_UNPACK_SIMD_H

#include <immintrin.h>

#include "matmul.h"
#include "unpack.h"

#define PAIRS8 8

/* A tile visits its columns' rows block by block, a row apart: a pattern the hardware
 * prefetchers follow poorly (single-thread Q4_K decode ran at 10 GB/s). Fetching the same
 * bytes of the next tile (tile_bytes further) as each block is read reached 33 GB/s. */
static inline void prefetch_next_tile(const uint8_t *blk, int64_t tile_bytes, int block_bytes) {
    const char *p = (const char *)blk + tile_bytes;
    for (int o = 0; o < block_bytes; o += 64) _mm_prefetch(p + o, _MM_HINT_T0);
}

/* lane i of the result = the sum of the 8 lanes of v[i] (exact int32) */
static inline __m256i reduce8(const __m256i v[PAIRS8]) {
    /* hadd pairs adjacent lanes within each 128-bit half */
    __m256i s01 = _mm256_hadd_epi32(v[0], v[1]);   /* [v0a v0b v1a v1b | v0c v0d v1c v1d] */
    __m256i s23 = _mm256_hadd_epi32(v[2], v[3]);
    __m256i s45 = _mm256_hadd_epi32(v[4], v[5]);
    __m256i s67 = _mm256_hadd_epi32(v[6], v[7]);
    __m256i s0123 = _mm256_hadd_epi32(s01, s23);   /* [v0 v1 v2 v3 (low half sums) | v0 v1 v2 v3 (high half)] */
    __m256i s4567 = _mm256_hadd_epi32(s45, s67);
    /* add the two 128-bit halves: low half of s0123 + high half of s0123 = full sums of v0..v3 */
    __m256i lo = _mm256_permute2x128_si256(s0123, s4567, 0x20);   /* [s0123.lo | s4567.lo] */
    __m256i hi = _mm256_permute2x128_si256(s0123, s4567, 0x31);   /* [s0123.hi | s4567.hi] */
    return _mm256_add_epi32(lo, hi);
}

/* scale vector for 32 values = groups g and g+1: int16 lanes 0-7 sc[g], lanes 8-15 sc[g+1] */
static inline __m256i group_scales(const int16_t *sc, int g, int uniform) {
    if (uniform) return _mm256_set1_epi16(sc[g]);
    return _mm256_set_m128i(_mm_set1_epi16(sc[g + 1]), _mm_set1_epi16(sc[g]));
}

/* SIMD unpacking of the hot types (the same bytes as unpack.h's loops) */
static inline void unpack_q4_k_avx2(const uint8_t *b, unpacked_block *o) {
    o->d = _cvtsh_ss(load_u16(b));
    o->dmin = _cvtsh_ss(load_u16(b + 2));
    unpack_k4_scales(b + 4, o);
    const __m256i m4 = _mm256_set1_epi8(0xF);
    for (int c = 0; c < 4; c++) {
        __m256i q = _mm256_loadu_si256((const __m256i *)(b + 16 + 32 * c));
        _mm256_store_si256((__m256i *)(o->w + 64 * c), _mm256_and_si256(q, m4));
        _mm256_store_si256((__m256i *)(o->w + 64 * c + 32), _mm256_and_si256(_mm256_srli_epi16(q, 4), m4));
    }
}

static inline void unpack_q6_k_avx2(const uint8_t *b, unpacked_block *o) {
    o->d = _cvtsh_ss(load_u16(b + 208));
    o->dmin = 0.0f;
    __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(b + 192)));
    _mm256_store_si256((__m256i *)o->sc, sc16);
    _mm256_store_si256((__m256i *)o->a, _mm256_slli_epi16(sc16, 5));
    const __m256i m4 = _mm256_set1_epi8(0xF), m30 = _mm256_set1_epi8(0x30);
    for (int h = 0; h < 2; h++) {
        __m256i l0 = _mm256_loadu_si256((const __m256i *)(b + 64 * h));
        __m256i l1 = _mm256_loadu_si256((const __m256i *)(b + 64 * h + 32));
        __m256i hb = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * h));
        uint8_t *w = o->w + 128 * h;
        _mm256_store_si256((__m256i *)w, _mm256_or_si256(_mm256_and_si256(l0, m4),
                                                          _mm256_and_si256(_mm256_slli_epi16(hb, 4), m30)));
        _mm256_store_si256((__m256i *)(w + 32), _mm256_or_si256(_mm256_and_si256(l1, m4),
                                                                 _mm256_and_si256(_mm256_slli_epi16(hb, 2), m30)));
        _mm256_store_si256((__m256i *)(w + 64), _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                                                 _mm256_and_si256(hb, m30)));
        _mm256_store_si256((__m256i *)(w + 96), _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                                                 _mm256_and_si256(_mm256_srli_epi16(hb, 2), m30)));
    }
}

static inline void unpack_iq4_xs_avx2(const uint8_t *b, unpacked_block *o) {
    o->d = _cvtsh_ss(load_u16(b));
    o->dmin = 0.0f;
    for (int ib = 0; ib < 8; ib++) {
        o->sc[2 * ib] = o->sc[2 * ib + 1] = (int16_t)iq4xs_scale(b, ib);
        o->a[2 * ib] = o->a[2 * ib + 1] = 0;
    }
    const __m128i table = _mm_loadu_si128((const __m128i *)KVALUES_IQ4NL), m4 = _mm_set1_epi8(0xF);
    for (int ib = 0; ib < 8; ib++) {
        __m128i q = _mm_loadu_si128((const __m128i *)(b + 8 + 16 * ib));
        _mm_store_si128((__m128i *)(o->w + 32 * ib), _mm_shuffle_epi8(table, _mm_and_si128(q, m4)));
        _mm_store_si128((__m128i *)(o->w + 32 * ib + 16),
                        _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(q, 4), m4)));
    }
}

static inline void unpack_kind(int kind, const uint8_t *b, unpacked_block *o) {
    switch (kind) {
    case MM_Q4_K: unpack_q4_k_avx2(b, o); break;
    case MM_Q5_K: unpack_q5_k(b, o); break;
    case MM_Q6_K: unpack_q6_k_avx2(b, o); break;
    default: unpack_iq4_xs_avx2(b, o); break;
    }
}

static inline __m256i q5_0_values(const uint8_t *b) {
    /* u = q + 16 in 0..31: low nibbles of qs are values 0..15, high nibbles 16..31, bit 4 from qh */
    __m128i qs = _mm_loadu_si128((const __m128i *)(b + 6));
    __m256i nib = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(qs, 4), _mm_set1_epi8(0xF)),
                                   _mm_and_si128(qs, _mm_set1_epi8(0xF)));
    uint32_t qh = load_u32(b + 2);
    /* spread the 32 bits of qh to 32 bytes: byte i gets 0x10 when bit i is set */
    const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                          2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bits = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i h = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), shuf);
    h = _mm256_cmpeq_epi8(_mm256_and_si256(h, bits), bits);
    return _mm256_or_si256(nib, _mm256_and_si256(h, _mm256_set1_epi8(0x10)));
}

#endif
