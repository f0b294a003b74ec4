/* Private declarations shared by the nn files. */
#ifndef NDM_NN_INTERNAL_H
#define NDM_NN_INTERNAL_H

#include "ndm/nn.h"

/* Is m a live module? */
bool ndm__module_valid(ndm_module m);

#endif
