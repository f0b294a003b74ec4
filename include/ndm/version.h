/* ndm version: the numbers of the headers a program was compiled with, and
 * ndm_version() for the library it runs with. The build reads these numbers,
 * so the library's soname, its pkg-config and CMake files and this header
 * cannot disagree.
 *
 * Versions follow semantic versioning: a program built against MAJOR.MINOR
 * runs with any library of the same MAJOR and an equal or later MINOR.
 *
 * Thread rules: none; everything here is constant.
 */
#ifndef NDM_VERSION_H
#define NDM_VERSION_H

#include "base.h"

/** The headers' major version: incompatible API changes. */
#define NDM_VERSION_MAJOR 0
/** The headers' minor version: compatible additions. */
#define NDM_VERSION_MINOR 1
/** The headers' patch version: fixes. */
#define NDM_VERSION_PATCH 0

/** One comparable number per version: NDM_VERSION_NUMBER(0, 1, 0) is 0x000100. */
#define NDM_VERSION_NUMBER(major, minor, patch) (((major) << 16) | ((minor) << 8) | (patch))
/** The headers' version as a number, for `#if NDM_VERSION >= NDM_VERSION_NUMBER(0, 2, 0)`. */
#define NDM_VERSION NDM_VERSION_NUMBER(NDM_VERSION_MAJOR, NDM_VERSION_MINOR, NDM_VERSION_PATCH)

#define NDM_VERSION_STR2_(x) #x
#define NDM_VERSION_STR_(x) NDM_VERSION_STR2_(x)
/** The headers' version as text, "0.1.0". */
#define NDM_VERSION_STRING                                                      \
    NDM_VERSION_STR_(NDM_VERSION_MAJOR)                                         \
    "." NDM_VERSION_STR_(NDM_VERSION_MINOR) "." NDM_VERSION_STR_(NDM_VERSION_PATCH)

#ifdef __cplusplus
extern "C" {
#endif

/** The version of the library running this program, as text ("0.1.0"). A
 *  static string; never fails. Compare with NDM_VERSION_STRING to see a
 *  program run with another library than it was built against. */
NDM_API const char *ndm_version(void);
/** The same version as NDM_VERSION_NUMBER(major, minor, patch); never fails. */
NDM_API unsigned ndm_version_number(void);

#ifdef __cplusplus
}
#endif

#endif
