/* bench/ops: operation throughput and overhead against anchors measured in
 * the same run. Arguments: section names to run (default: all: elementwise,
 * reduce, linalg, conv), --quick for a short run, --json for one JSON object. */
#include <string.h>

#include "sections.h"

static const struct {
    const char *name;
    void (*run)(bench_report *r);
} sections[] = {
    {"elementwise", bench_ops_elementwise},
    {"reduce", bench_ops_reduce},
    {"linalg", bench_ops_linalg},
    {"conv", bench_ops_conv},
};

int main(int argc, char **argv)
{
    if (bench_ops_linalg_child(argc, argv))
        return 0;
    static bench_report r;
    r.o = bench_parse(argc, argv);
    int named = 0;
    for (int i = 1; i < argc; i++)
        named += argv[i][0] != '-';
    for (size_t s = 0; s < sizeof sections / sizeof *sections; s++) {
        bool run = named == 0;
        for (int i = 1; i < argc && !run; i++)
            run = !strcmp(argv[i], sections[s].name);
        if (run)
            sections[s].run(&r);
    }
    bench_print(&r);
    return 0;
}
