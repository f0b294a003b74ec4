/* Collectives on CUDA arrays: NCCL, reached through the CUDA module's
 * collective table (libndm links no CUDA library), bootstrapped over MPI. */
#include <string.h>

#include "group.h"

const ndm__backend_collective *ndm__nccl_table(const char *api, ndm__site site)
{
    const char *missing = NULL;
    const ndm__backend_collective *t = ndm__collectives(NDM_DEVICE_CUDA, &missing);
    if (missing) {
        ndm__fail(NDM_E_UNSUPPORTED, api, site,
                  "collectives on CUDA arrays go over NCCL in the CUDA module, which is not "
                  "available: %s",
                  missing);
        return NULL;
    }
    if (!t) {
        ndm__fail(NDM_E_UNSUPPORTED, api, site,
                  "collectives on CUDA arrays go over NCCL, and the CUDA module was built "
                  "without it (install NCCL and reconfigure with -Dnccl=auto)");
        return NULL;
    }
    return t;
}

/* Rank 0 makes the id and every rank hears of its failure (one agreement),
 * the id's bytes go out over MPI, every rank makes its communicator, and
 * every rank hears of any rank's failure (a second agreement): the ranks
 * hold a communicator for `device` all together or none does. */
static ndm_status comm_new(ndm__dist_group *g, const ndm__backend_collective *t, int device,
                           const char *api, ndm__site site)
{
    unsigned char id[NDM__COLL_ID_MAX];
    memset(id, 0, sizeof id);
    ndm_status local = g->rank == 0 ? t->unique_id(id) : NDM_OK;
    ndm_status st = ndm__dist_agree(g, NDM__DIST_CHECK, 0, NULL, local, NULL, api, site);
    if (st < 0)
        return st;
    MPI_Request req;
    if (MPI_Ibcast(id, (int)t->id_bytes, MPI_BYTE, 0, g->comm, &req) != MPI_SUCCESS)
        return ndm__fail(NDM_E_IO, api, site, "MPI_Ibcast of the NCCL unique id failed");
    if ((st = ndm__dist_wait(g, &req, 1, NULL, 0, api, site)) < 0)
        return st;
    void *comm = NULL;
    local = t->comm_new(id, g->size, g->rank, device, &comm);
    st = ndm__dist_agree(g, NDM__DIST_CHECK, 0, NULL, local, NULL, api, site);
    if (st < 0) {
        if (comm)
            t->comm_free(comm);
        return st;
    }
    g->nccl[device] = comm;
    return NDM_OK;
}

ndm_status ndm__nccl_comm(ndm__dist_group *g, int device, const ndm__backend_collective **table,
                          void **comm, const char *api, ndm__site site)
{
    /* the agreement came first: every rank has a CUDA array, all on the
     * same device index, and the module's table */
    const ndm__backend_collective *t = ndm__nccl_table(api, site);
    if (!t)
        return ndm_last_status();
    if (device < 0 || device >= NDM__MAX_CUDA)
        return ndm__fail(NDM_E_DEVICE, api, site, "cuda:%d: no such device", device);
    if (!g->nccl[device]) {
        ndm_status st = comm_new(g, t, device, api, site);
        if (st < 0)
            return st;
    }
    *table = t;
    *comm = g->nccl[device];
    return NDM_OK;
}

void ndm__nccl_free_all(ndm__dist_group *g)
{
    const ndm__backend_collective *t = NULL;
    for (int d = 0; d < NDM__MAX_CUDA; d++) {
        if (!g->nccl[d])
            continue;
        /* a communicator was made, so the module and its table are there */
        if (!t)
            t = ndm__collectives(NDM_DEVICE_CUDA, NULL);
        t->comm_free(g->nccl[d]);
        g->nccl[d] = NULL;
    }
}
