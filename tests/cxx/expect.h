/* EXPECT(cond) for the C++ test programs: a failed expectation is printed
 * with its line and counted in `failures`, and the program goes on. */
#ifndef NDM_TESTS_CXX_EXPECT_H
#define NDM_TESTS_CXX_EXPECT_H

#include <cstdio>

static int failures;
#define EXPECT(cond)                                                                       \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            std::fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond);      \
            failures++;                                                                    \
        }                                                                                  \
    } while (0)

#endif
