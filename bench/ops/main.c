/* bench/ops: operation throughput and overhead against anchors measured in
 * the same run. Arguments: section names to run (default: all), --quick
 * for a short run, --json for one JSON object. */
#include <string.h>

#include "sections.h"

static const struct {
    const char *name;
    void (*run)(bench_report *r);
} sections[] = {
    {"elementwise", bench_ops_elementwise},
};

int main(int argc, char **argv)
{
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
