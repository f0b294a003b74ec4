/* ndm streams and events: the order in which a device runs work.
 *
 * A stream is a queue of work on one device that runs in order; work on
 * different streams may overlap. Every device has a default stream,
 * ndm_stream_default(device), which exists as long as the process and is
 * never released. More streams come from ndm_stream_new(m), on the device of
 * manager `m`, which owns them: they are released when m closes, or earlier
 * by ndm_stream_release. Events (ndm_event_new) mark a point in a stream:
 * ndm_event_record(e, s) marks the point s has reached now; another stream
 * can wait for it (ndm_stream_wait_event) without the host waiting; the
 * host can ask (ndm_event_query) or wait (ndm_event_synchronize).
 *
 * Each thread has a current stream per device (PyTorch's model), the
 * default stream until ndm_stream_set_current changes it: every operation
 * this thread runs on that device goes to it, and the arrays it allocates
 * there belong to it. The allocator reuses a freed block only for work on
 * the block's own stream (which runs in order, so the reuse is safe without
 * waiting). An array used by work on another stream must be declared with
 * ndm_array_record_stream(a, s) (PyTorch's record_stream): when its storage
 * is freed, the allocator records an event on s and hands the memory out
 * again only once the event is complete.
 *
 * On the CPU every call does its work before it returns: its streams and
 * events exist and behave as the same calls on a GPU would, but they are
 * always complete, so code written for streams runs unchanged on the CPU.
 *
 * Handles are values (like arrays'): a zeroed one is the null handle
 * (NDM_E_NULL, or the thread's earlier error, as for arrays), and a
 * released one is stale: using it is NDM_E_CLOSED, releasing it again is
 * NDM_ALREADY; a handle never issued, or an event's given as a stream's, is
 * NDM_E_INVALID. A stream or event used with another device's stream or
 * event is NDM_E_DEVICE. These errors apply to every function below. Releasing a stream or event while work that uses it
 * is still queued is safe: the backend keeps it until the work is done.
 *
 * Thread rules: every function is thread-safe. The current stream is the
 * calling thread's own. Releasing a stream that another thread has made its
 * current is a caller bug (that thread's work then goes to a recycled
 * stream, never to freed memory); the releasing thread's own current stream
 * returns to the default.
 */
#ifndef NDM_STREAM_H
#define NDM_STREAM_H

#include <stdbool.h>

#include "array.h"
#include "base.h"
#include "device.h"
#include "manager.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** A stream: a value, not a pointer; zero is the null handle. */
typedef struct ndm_stream {
    uint64_t id; /**< packs a slot and a generation, or a device's default stream */
} ndm_stream;

/** An event: a value, not a pointer; zero is the null handle. */
typedef struct ndm_event {
    uint64_t id; /**< packs a slot and a generation */
} ndm_event;

/** The default stream of `device`, which belongs to the device and is
 *  never released; the null handle for a device this build or machine
 *  lacks (NDM_E_DEVICE or NDM_E_UNSUPPORTED recorded). */
NDM_API ndm_stream ndm_stream_default(ndm_device device);

/** A new stream on the device of manager m, owned by m (released when m
 *  closes). On success *out is the stream; on failure it is null and
 *  nothing is owned: NDM_E_INVALID (out is NULL), NDM_E_CLOSED (m closed or
 *  stale), NDM_E_ROOT (system or detached own nothing), NDM_E_DEVICE,
 *  NDM_E_OOM. */
NDM_API NDM_NODISCARD ndm_status ndm_stream_new(ndm_manager m, ndm_stream *out);

/** Release a stream before its manager closes. NDM_OK, NDM_ALREADY (it was
 *  released), NDM_E_INVALID (a default stream is never released, or the
 *  null handle). */
NDM_API NDM_NODISCARD ndm_status ndm_stream_release(ndm_stream s);

/** The device of a stream (the CPU, with NDM_E_NULL, NDM_E_CLOSED or
 *  NDM_E_INVALID recorded, for a null, stale or forged handle). */
NDM_API ndm_device ndm_stream_device(ndm_stream s);

/** Wait until every work queued on s has run. NDM_OK; NDM_E_CLOSED (stale
 *  or null), NDM_E_DEVICE (the device failed, with its reason). */
NDM_API NDM_NODISCARD ndm_status ndm_stream_synchronize(ndm_stream s);

/** *done = everything queued on s has run. Errors as ndm_stream_synchronize,
 *  and NDM_E_INVALID for a NULL done. */
NDM_API NDM_NODISCARD ndm_status ndm_stream_query(ndm_stream s, bool *done);

/** Make s the calling thread's current stream on s's device. NDM_OK;
 *  NDM_E_CLOSED (stale or null). */
NDM_API NDM_NODISCARD ndm_status ndm_stream_set_current(ndm_stream s);

/** The calling thread's current stream on `device` (its default stream
 *  unless set): a stream still owned by the manager that made it (or the
 *  device's default), not a new one to release; the null handle for a
 *  device this build or machine lacks (NDM_E_DEVICE or NDM_E_UNSUPPORTED
 *  recorded). */
NDM_API ndm_stream ndm_stream_current(ndm_device device);

/** Work queued on s from now on waits until e's recorded point has passed
 *  (the host does not wait). An event never recorded is complete. NDM_OK;
 *  NDM_E_CLOSED (either stale or null), NDM_E_DEVICE (another device). */
NDM_API NDM_NODISCARD ndm_status ndm_stream_wait_event(ndm_stream s, ndm_event e);

/** A new event on the device of manager m, owned by m; errors as
 *  ndm_stream_new. */
NDM_API NDM_NODISCARD ndm_status ndm_event_new(ndm_manager m, ndm_event *out);

/** Release an event before its manager closes. NDM_OK, NDM_ALREADY,
 *  NDM_E_INVALID (the null handle). */
NDM_API NDM_NODISCARD ndm_status ndm_event_release(ndm_event e);

/** Mark in e the point s has reached now (a later record moves it). NDM_OK;
 *  NDM_E_CLOSED (either stale or null), NDM_E_DEVICE (s on another device,
 *  or a device failure). */
NDM_API NDM_NODISCARD ndm_status ndm_event_record(ndm_event e, ndm_stream s);

/** *done = e's recorded point has passed (true when never recorded).
 *  NDM_E_CLOSED, NDM_E_INVALID (done NULL), NDM_E_DEVICE. */
NDM_API NDM_NODISCARD ndm_status ndm_event_query(ndm_event e, bool *done);

/** Wait until e's recorded point has passed. NDM_E_CLOSED, NDM_E_DEVICE. */
NDM_API NDM_NODISCARD ndm_status ndm_event_synchronize(ndm_event e);

/** Declare that work queued on s uses a's storage (PyTorch's
 *  record_stream): when the storage is freed, its memory waits for that
 *  work before it is reused. The storage's own stream needs no record, nor
 *  does memory the allocator does not own (a wrapped buffer: its owner
 *  frees it). NDM_OK (also on the CPU, where nothing waits); NDM_E_CLOSED
 *  (a stale array or stream), NDM_E_DEVICE (s is on another device than
 *  a), NDM_E_OOM. */
NDM_API NDM_NODISCARD ndm_status ndm_array_record_stream(ndm_array a, ndm_stream s);

#ifdef __cplusplus
}
#endif

#endif
