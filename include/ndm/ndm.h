/* ndm: n-dimensional arrays owned by a tree of managers.
 *
 * One include for the whole API. Every array is owned by a manager; closing
 * a manager frees its whole subtree; scopes catch temporaries; the debug
 * dump and leak reports say who holds what, and where it was made.
 */
#ifndef NDM_NDM_H
#define NDM_NDM_H

#include "ndm/config.h"
#include "version.h"
#include "base.h"
#include "status.h"
#include "device.h"
#include "dtype.h"
#include "manager.h"
#include "array.h"
#include "view.h"
#include "scope.h"
#include "plan.h"
#include "debug.h"
#include "elementwise.h"
#include "reduce.h"
#include "linalg.h"
#include "index.h"
#include "conv.h"
#include "random.h"
#include "memory.h"
#include "autograd.h"
#include "nn.h"
#include "serve.h"
#include "transfer.h"
#include "stream.h"

#include "io.h"
#include "dlpack.h"
#include "data.h"
#include "dist.h"

#endif
