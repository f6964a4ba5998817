/* The Gated DeltaNet token update shared by gdn.c (AR rows, segments, prefill) and
 * gdn_tree.c (tree verify, commit replay): one function, so every path advances a state with
 * the same bits (DESIGN 5 rule 4). Reference: luce/ref/gdn_recurrent.py. */
#ifndef LUCE_CPU_GDN_STEP_H
#define LUCE_CPU_GDN_STEP_H

#include "seq_common.h"

#define GDN_MAX_DV 1024   /* value dims a head may have (per-token scratch lives on the stack) */

/* the decay factor of log-decay g: (float) exp((double) g) */
float gdn_decay(float g);

/* One token on one head's state h [Dk, Dv] in place (gdn.c header comment for the maths).
 * v != NULL: computes u [Dv] = beta (v - (decay h)^T k); v == NULL: u is given (commit replay
 * of a tree node's factor). q != NULL: also o [Dv] = h_new^T q. */
void gdn_token(float *h, int64_t Dk, int64_t Dv, float decay, const float *k, const float *v, float beta,
               float *u, const float *q, float *o);

/* LUCE_CPU_OK if the sizes of r are ones the kernels take */
int gdn_check_rows(const luce_cpu_gdn_rows *r);

/* tokens t0..t1-1 of r on head `head` from state h [Dk, Dv] (in place), outputs into o [T, H, Dv] */
void gdn_run_tokens(const luce_cpu_gdn_rows *r, int64_t head, int64_t t0, int64_t t1, float *h, float *o);

#endif
