/* Byte accounting: per-manager live and peak bytes, subtree limits, and the
 * lifetime counts a closing child leaves to its parent. Limits are kept only
 * on managers that set one, so unlimited trees pay nothing. */
#include <inttypes.h>

#include "core.h"

_Atomic(ndm__quota_relief_fn) ndm__quota_relief;

void ndm__manager_count_recomputed(ndm_manager h, uint64_t bytes)
{
    ndm__manager *m = ndm__manager_peek(h);
    if (m)
        atomic_fetch_add_explicit(&m->recomputed, bytes, memory_order_relaxed);
}

static inline ndm__manager *anchor_of(ndm__manager *m)
{
    uint32_t a = atomic_load_explicit(&m->limit_anchor, memory_order_acquire);
    return a ? ndm__manager_slot(a) : NULL;
}

/* The next limited manager strictly above the limited manager l. */
static inline ndm__manager *anchor_above(ndm__manager *l)
{
    /* (an atomic load: ndm_manager_move changes it under l's lock, which
     * a creation below l does not hold) */
    uint32_t up = __atomic_load_n(&l->parent, __ATOMIC_RELAXED);
    ndm__manager *p = up ? ndm__manager_slot(up) : NULL;
    return p ? anchor_of(p) : NULL;
}

/* Reserve n bytes on every limited manager from l upwards, stopping before
 * `stop` (a limited manager that already holds them). With no `api` a
 * refusal writes no message (the caller may hold manager locks, and the
 * message takes the tree lock) and is described in `miss` when given. */
static ndm_status reserve_chain(ndm__manager *l, ndm__manager *stop, int dev, int64_t n,
                                bool force, const char *api, ndm__site where,
                                ndm__quota_miss *miss)
{
    for (ndm__manager *x = l; x && x != stop; x = anchor_above(x)) {
        int64_t now = atomic_fetch_add_explicit(&x->limits->used[dev], n, memory_order_relaxed) + n;
        uint64_t lim = atomic_load_explicit(&x->limits->limit[dev], memory_order_relaxed);
        if (!force && lim && now > (int64_t)lim) {
            atomic_fetch_sub_explicit(&x->limits->used[dev], n, memory_order_relaxed);
            for (ndm__manager *y = l; y != x; y = anchor_above(y))
                atomic_fetch_sub_explicit(&y->limits->used[dev], n, memory_order_relaxed);
            if (!api) {
                if (miss)
                    *miss = (ndm__quota_miss){x->self, dev, n, now - n, lim};
                return NDM_E_QUOTA;
            }
            char path[512], devs[32];
            ndm__manager_path(x->self, path, sizeof path);
            ndm_device_str(ndm__slot_device(dev), devs, sizeof devs);
            return ndm__fail(NDM_E_QUOTA, api, where,
                             "%" PRId64 " bytes on %s would exceed the limit of manager '%s' "
                             "(limit %" PRIu64 ", in use %" PRId64 ")",
                             n, devs, path, lim, now - n);
        }
    }
    return NDM_OK;
}

static void release_chain(ndm__manager *l, ndm__manager *stop, int dev, int64_t n)
{
    for (ndm__manager *x = l; x && x != stop; x = anchor_above(x))
        atomic_fetch_sub_explicit(&x->limits->used[dev], n, memory_order_relaxed);
}

ndm_status ndm__limit_reserve(ndm__manager *m, int dev, int64_t bytes, const char *api,
                              ndm__site where)
{
    ndm__manager *l = anchor_of(m);
    return l ? reserve_chain(l, NULL, dev, bytes, false, api, where, NULL) : NDM_OK;
}

ndm_status ndm__limit_reserve_quiet(ndm__manager *m, int dev, int64_t bytes,
                                    ndm__quota_miss *miss)
{
    ndm__manager *l = anchor_of(m);
    return l ? reserve_chain(l, NULL, dev, bytes, false, NULL, NDM__NO_SITE, miss) : NDM_OK;
}

ndm_status ndm__quota_fail(const ndm__quota_miss *miss, const char *api, ndm__site where)
{
    char path[512], devs[32];
    ndm__manager_path(miss->slot, path, sizeof path);
    ndm_device_str(ndm__slot_device(miss->dev), devs, sizeof devs);
    return ndm__fail(NDM_E_QUOTA, api, where,
                     "%" PRId64 " bytes on %s would exceed the limit of manager '%s' "
                     "(limit %" PRIu64 ", in use %" PRId64 ")",
                     miss->bytes, devs, path, miss->limit, miss->used);
}

void ndm__limit_release(ndm__manager *m, int dev, int64_t bytes)
{
    ndm__manager *l = anchor_of(m);
    if (l)
        release_chain(l, NULL, dev, bytes);
}

/* Is limited manager x on the chain that starts at l? */
static bool on_chain(ndm__manager *l, ndm__manager *x)
{
    for (; l; l = anchor_above(l))
        if (l == x)
            return true;
    return false;
}

/* Move a charge from `from` to `to`. Limited ancestors common to both keep it. */
ndm_status ndm__charge_move(ndm__manager *from, ndm__manager *to, int dev, int64_t bytes,
                            bool force, bool to_unlocked, const char *api, ndm__site where)
{
    ndm__manager *lf = anchor_of(from), *lt = anchor_of(to);
    /* The first limited manager on to's chain that is also on from's chain. */
    ndm__manager *common = NULL;
    for (ndm__manager *x = lt; x; x = anchor_above(x))
        if (on_chain(lf, x)) {
            common = x;
            break;
        }
    if (lt) {
        ndm_status st = reserve_chain(lt, common, dev, bytes, force, api, where, NULL);
        if (st < 0)
            return st;
    }
    if (lf)
        release_chain(lf, common, dev, bytes);
    if (to_unlocked) {
        ndm__dev_mark(to, dev);
        atomic_fetch_add_explicit(&to->count[dev].inbox, bytes, memory_order_relaxed);
    }
    else
        ndm__bytes_add(to, dev, bytes);
    ndm__bytes_sub(from, dev, bytes);
    return NDM_OK;
}

/* The first limited manager on to's chain that is also on from's chain:
 * from there up, a charge moving from `from` to `to` is already counted. */
static ndm__manager *common_anchor(ndm__manager *from, ndm__manager *to)
{
    ndm__manager *lf = anchor_of(from);
    for (ndm__manager *x = anchor_of(to); x; x = anchor_above(x))
        if (on_chain(lf, x))
            return x;
    return NULL;
}

ndm_status ndm__charge_reserve(ndm__manager *from, ndm__manager *to, int dev, int64_t bytes,
                               ndm__quota_miss *miss)
{
    ndm__manager *lt = anchor_of(to);
    return lt ? reserve_chain(lt, common_anchor(from, to), dev, bytes, false, NULL, NDM__NO_SITE,
                              miss)
              : NDM_OK;
}

void ndm__charge_unreserve(ndm__manager *from, ndm__manager *to, int dev, int64_t bytes)
{
    ndm__manager *lt = anchor_of(to);
    if (lt)
        release_chain(lt, common_anchor(from, to), dev, bytes);
}

void ndm__charge_commit(ndm__manager *from, ndm__manager *to, int dev, int64_t bytes)
{
    ndm__manager *lf = anchor_of(from);
    if (lf)
        release_chain(lf, common_anchor(from, to), dev, bytes);
    ndm__bytes_add(to, dev, bytes);
    ndm__bytes_sub(from, dev, bytes);
}

ndm_status ndm__charge_check(ndm__manager *from, ndm__manager *to, int dev, int64_t bytes,
                             const char *api, ndm__site where)
{
    ndm__quota_miss miss;
    ndm_status st = ndm__charge_fits(from, to, dev, bytes, &miss);
    return st == NDM_OK ? st : ndm__quota_fail(&miss, api, where);
}

ndm_status ndm__charge_fits(ndm__manager *from, ndm__manager *to, int dev, int64_t bytes,
                            ndm__quota_miss *miss)
{
    ndm__manager *lf = anchor_of(from), *lt = anchor_of(to);
    for (ndm__manager *x = lt; x; x = anchor_above(x)) {
        if (on_chain(lf, x))
            break; /* from here up the bytes are already counted */
        int64_t used = atomic_load_explicit(&x->limits->used[dev], memory_order_relaxed);
        uint64_t lim = atomic_load_explicit(&x->limits->limit[dev], memory_order_relaxed);
        if (lim && used + bytes > (int64_t)lim) {
            *miss = (ndm__quota_miss){x->self, dev, bytes, used, lim};
            return NDM_E_QUOTA;
        }
    }
    return NDM_OK;
}

void ndm__lifetime_fold(ndm__manager *m)
{
    if (!m->parent)
        return;
    ndm__manager *p = ndm__manager_rec(m->parent);
    ndm__mlock_take(m);
    uint64_t created = m->created, released = m->released;
    ndm__mlock_drop(m);
    p->closed_created += created + m->closed_created;
    p->closed_released += released + m->closed_released;
}
