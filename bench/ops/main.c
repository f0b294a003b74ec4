/* bench/ops: operation throughput and overhead against anchors measured in
 * the same run. Arguments: section names to run (default: all: elementwise,
 * reduce, linalg, conv, attention), --quick for a short run, --json for one JSON object.
 * linalg is measured again without the OpenBLAS variables (blas_env.h). */
#include <string.h>

#include "../blas_env.h"
#include "sections.h"

static const struct {
    const char *name;
    void (*run)(bench_report *r);
} sections[] = {
    {"elementwise", bench_ops_elementwise},
    {"reduce", bench_ops_reduce},
    {"linalg", bench_ops_linalg},
    {"conv", bench_ops_conv},
    {"attention", bench_ops_attention},
};

int main(int argc, char **argv)
{
    static bench_report r;
    r.o = bench_parse(argc, argv);
    if (bench_blas_is_child(argc, argv)) {
        bench_ops_linalg(&r);
        bench_blas_child_emit(&r);
        return 0;
    }
    int named = 0;
    for (int i = 1; i < argc; i++)
        named += argv[i][0] != '-';
    for (size_t s = 0; s < sizeof sections / sizeof *sections; s++) {
        bool run = named == 0;
        for (int i = 1; i < argc && !run; i++)
            run = !strcmp(argv[i], sections[s].name);
        if (run) {
            sections[s].run(&r);
            if (sections[s].run == bench_ops_linalg)
                bench_blas_rerun(&r, "linalg", r.o.quick, (char *[]){"--quick"});
        }
    }
    bench_print(&r);
    return 0;
}
