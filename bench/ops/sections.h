/* The sections of bench/ops, one per operation family; each adds its
 * figures (with the anchors it measures in the same run) to the report. */
#ifndef NDM_BENCH_OPS_SECTIONS_H
#define NDM_BENCH_OPS_SECTIONS_H

#include "../bench.h"

void bench_ops_elementwise(bench_report *r);
void bench_ops_reduce(bench_report *r);
void bench_ops_linalg(bench_report *r);
void bench_ops_conv(bench_report *r);

#endif
