/* log_child.c compiled as C++17: NDM_CHECK and the log API behave the same. */
#include "log_child.c"
