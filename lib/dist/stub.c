/* The process group when ndm is built without MPI: the same API, every
 * call answering NDM_E_UNSUPPORTED with a message. */
#include "ndm/dist.h"
#include "../base/error.h"

#define WHY "ndm was built without MPI (install libopenmpi-dev and reconfigure with -Dmpi=auto)"

static ndm_status unsupported(const char *api) { return ndm__fail(NDM_E_UNSUPPORTED, api, NDM__NO_SITE, WHY); }

NDM_API bool ndm_dist_available(void) { return false; }
NDM_API ndm_status ndm_dist_init(void) { return unsupported(__func__); }
NDM_API ndm_status ndm_dist_finalize(void) { return unsupported(__func__); }
NDM_API int ndm_dist_rank(void) { return 0; }
NDM_API int ndm_dist_size(void) { return 1; }
NDM_API int ndm_dist_local_rank(void) { return 0; }
NDM_API ndm_status ndm_dist_set_timeout(double seconds) { (void)seconds; return unsupported(__func__); }
NDM_API ndm_status ndm_dist_check_at(NDM_SITE_PARAMS, ndm_status local) { (void)local; return unsupported(__func__); }
NDM_API ndm_status ndm_all_reduce_inplace_at(NDM_SITE_PARAMS, ndm_array a, ndm_dist_op op) { return unsupported(__func__); }
NDM_API ndm_status ndm_broadcast_inplace_at(NDM_SITE_PARAMS, ndm_array a, int root) { return unsupported(__func__); }
NDM_API ndm_array ndm_all_gather_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a)
{
    unsupported(__func__);
    return NDM_NULL_ARRAY;
}
NDM_API ndm_array ndm_reduce_scatter_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, ndm_dist_op op)
{
    unsupported(__func__);
    return NDM_NULL_ARRAY;
}
NDM_API ndm_status ndm_dist_debug_dump(ndm_manager m, FILE *f) { return unsupported(__func__); }
NDM_API int64_t ndm_dist_leak_report(FILE *f) { return unsupported(__func__); }
NDM_API ndm_ddp ndm_ddp_new_at(NDM_SITE_PARAMS, ndm_manager model, ndm_module net, ndm_optimizer opt,
                               const ndm_ddp_options *opts)
{
    unsupported(__func__);
    return (ndm_ddp){0};
}
NDM_API ndm_status ndm_ddp_backward_at(NDM_SITE_PARAMS, ndm_ddp d, ndm_array loss) { return unsupported(__func__); }
NDM_API ndm_status ndm_ddp_step_at(NDM_SITE_PARAMS, ndm_ddp d) { return unsupported(__func__); }
NDM_API int ndm_ddp_buckets(ndm_ddp d) { return unsupported(__func__); }
NDM_API ndm_status ndm_ddp_close(ndm_ddp d) { return unsupported(__func__); }
NDM_API ndm_loader ndm_dist_loader_new_at(NDM_SITE_PARAMS, ndm_manager trainer, ndm_dataset data,
                                          const ndm_loader_options *opts)
{
    unsupported(__func__);
    return (ndm_loader){0};
}
