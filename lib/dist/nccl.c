/* The NCCL communicator for CUDA arrays, bootstrapped over the MPI group:
 * rank 0 makes the unique id and broadcasts it. Built when NCCL is found. */
#include <mpi.h>
#include <nccl.h>

#include "group.h"

/* A communicator over the group's ranks on CUDA device `device` (already
 * current on this thread), or NULL with the error recorded. */
ncclComm_t ndm__nccl_comm_new(ndm__dist_group *g, const char *api, ndm__site site);

ncclComm_t ndm__nccl_comm_new(ndm__dist_group *g, const char *api, ndm__site site)
{
    ncclUniqueId id;
    if (g->rank == 0 && ncclGetUniqueId(&id) != ncclSuccess) {
        ndm__fail(NDM_E_DEVICE, api, site, "ncclGetUniqueId failed");
        return NULL;
    }
    MPI_Request req;
    if (MPI_Ibcast(&id, (int)sizeof id, MPI_BYTE, 0, g->comm, &req) != MPI_SUCCESS ||
        ndm__dist_wait(g, &req, 1, NULL, 0, api, site) < 0)
        return NULL;
    ncclComm_t comm = NULL;
    ncclResult_t rc = ncclCommInitRank(&comm, g->size, id, g->rank);
    if (rc != ncclSuccess) {
        ndm__fail(NDM_E_DEVICE, api, site, "ncclCommInitRank: %s", ncclGetErrorString(rc));
        return NULL;
    }
    return comm;
}
