/* The operations benchmark: every section's figures beside anchors measured
 * in the same run. --json for one JSON object, --quick for a short run. */
#include "sections.h"

int main(int argc, char **argv)
{
    if (bench_ops_linalg_child(argc, argv))
        return 0;
    static bench_report r;
    r.o = bench_parse(argc, argv);
    bench_ops_reduce(&r);
    bench_ops_linalg(&r);
    bench_ops_conv(&r);
    bench_print(&r);
    return 0;
}
