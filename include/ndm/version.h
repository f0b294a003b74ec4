/* ndm version. The build reads these numbers, so the library's soname and
 * this header cannot disagree. */
#ifndef NDM_VERSION_H
#define NDM_VERSION_H

#define NDM_VERSION_MAJOR 0
#define NDM_VERSION_MINOR 1
#define NDM_VERSION_PATCH 0

#endif
