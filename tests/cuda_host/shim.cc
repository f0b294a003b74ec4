/* Host execution's launch shim: a grid runs block after block on the calling
 * thread, each block's threads as cooperative fibers on reused stacks (test-only).
 *
 * A fiber takes the block's next unstarted thread whenever its own thread
 * ends, so a kernel that never waits runs all its threads on one fiber with
 * no switch at all. A thread that must wait (__syncthreads, a warp exchange)
 * parks its fiber; the scheduler then resumes a runnable fiber or starts the
 * next thread on another. When every thread of a block has either ended or
 * parked at a barrier that cannot complete, the launch fails as a divergent
 * barrier would hang or corrupt a GPU: cudaErrorLaunchFailure, sticky. */
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

#include <deque>
#include <vector>

#include "hx.h"

#if defined(__SANITIZE_ADDRESS__)
#define HX_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HX_ASAN 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define HX_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define HX_TSAN 1
#endif
#endif
#ifdef HX_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif
#ifdef HX_TSAN
#include <sanitizer/tsan_interface.h>
#endif

#if defined(__x86_64__)
/* Six callee-saved registers and the stack pointer: a switch is a few
 * instructions, where swapcontext also makes a system call for the signal
 * mask. */
extern "C" void ndm__hx_switch(void **save_sp, void *to_sp);
asm(R"(
    .pushsection .text
    .globl ndm__hx_switch
    .hidden ndm__hx_switch
    .type ndm__hx_switch,@function
ndm__hx_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size ndm__hx_switch,.-ndm__hx_switch
    .popsection
)");
#else
#include <ucontext.h>
#endif

thread_local uint3 ndm__hx_threadIdx;
thread_local uint3 ndm__hx_blockIdx;
thread_local dim3 ndm__hx_blockDim;
thread_local dim3 ndm__hx_gridDim;

namespace {

#ifdef HX_ASAN
const size_t STACK = 512 << 10; /* instrumented frames are large */
#else
const size_t STACK = 256 << 10;
#endif
const size_t GUARD = 4096;

enum fiber_state { IDLE, RUNNING, WAITING, RUNNABLE };

struct fiber {
    char *map = nullptr; /* guard page, then the stack */
    char *stack = nullptr;
    bool fresh = true;   /* start at the entry on the next switch in */
    fiber_state state = IDLE;
    int linear = 0;      /* the thread it runs */
    uint3 tid = {0, 0, 0};
    jmp_buf trap;
#if defined(__x86_64__)
    void *sp = nullptr;
#else
    ucontext_t uc;
#endif
#ifdef HX_ASAN
    void *fake = nullptr;
#endif
#ifdef HX_TSAN
    void *tsan = nullptr;
#endif
};

struct barrier {
    int expected = 0;
    int arrived = 0;
    std::vector<fiber *> waiters;
};

struct sched {
    /* the launching thread's own context */
#if defined(__x86_64__)
    void *main_sp = nullptr;
#else
    ucontext_t main_uc;
#endif
#ifdef HX_ASAN
    const void *main_bottom = nullptr;
    size_t main_size = 0;
#endif
#ifdef HX_TSAN
    void *tsan_main = nullptr;
#endif
    std::vector<fiber *> all, idle;
    fiber *cur = nullptr;
    std::deque<fiber *> runnable;

    bool active = false;
    void (*body)(void *) = nullptr;
    void *ctx = nullptr;
    dim3 block;
    int nthreads = 0, next_start = 0, live = 0;
    barrier block_bar;
    std::vector<barrier> warp_bar;
    std::vector<unsigned> warp_gen;
    std::vector<uint64_t> slots; /* [warp][generation parity][lane] */
    unsigned char *dyn = nullptr;
    size_t dyn_cap = 0;
    bool failed = false;
    char why[200] = "";
    unsigned long long parks = 0; /* threads that had to wait, ever */

    ~sched()
    {
        for (fiber *f : all) {
            munmap(f->map, STACK + GUARD);
#ifdef HX_TSAN
            __tsan_destroy_fiber(f->tsan);
#endif
            delete f;
        }
        free(dyn);
    }
};

thread_local sched S;

void fiber_entry();

#if !defined(__x86_64__)
void fiber_entry_uc() { fiber_entry(); }
#endif

/* Point a fiber at the start of fiber_entry on a clean stack. */
void init_fiber(fiber *f)
{
#ifdef HX_ASAN
    /* An abandoned fiber leaves its frames' redzones poisoned. */
    __asan_unpoison_memory_region(f->stack, STACK);
    f->fake = nullptr;
#endif
#if defined(__x86_64__)
    uintptr_t *sp = (uintptr_t *)(f->stack + STACK);
    *--sp = 0;                        /* fiber_entry's return address: never used */
    *--sp = (uintptr_t)fiber_entry;   /* where the switch returns to */
    for (int i = 0; i < 6; i++)
        *--sp = 0;                    /* rbp rbx r12 r13 r14 r15 */
    f->sp = sp;
#else
    getcontext(&f->uc);
    f->uc.uc_stack.ss_sp = f->stack;
    f->uc.uc_stack.ss_size = STACK;
    f->uc.uc_link = nullptr;
    makecontext(&f->uc, fiber_entry_uc, 0);
#endif
#ifdef HX_TSAN
    if (f->tsan)
        __tsan_destroy_fiber(f->tsan);
    f->tsan = __tsan_create_fiber(0);
#endif
    f->fresh = false;
}

fiber *new_fiber()
{
    void *m = mmap(nullptr, STACK + GUARD, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED)
        return nullptr;
    mprotect(m, GUARD, PROT_NONE); /* overflow faults instead of corrupting */
    fiber *f = new fiber;
    f->map = (char *)m;
    f->stack = (char *)m + GUARD;
    S.all.push_back(f);
    return f;
}

/* From the scheduler into f; returns when f parks or goes idle. */
void to_fiber(fiber *f)
{
    if (f->fresh)
        init_fiber(f);
    S.cur = f;
    f->state = RUNNING;
    ndm__hx_threadIdx = f->tid;
#ifdef HX_ASAN
    void *fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, f->stack, STACK);
#endif
#ifdef HX_TSAN
    __tsan_switch_to_fiber(f->tsan, 0);
#endif
#if defined(__x86_64__)
    ndm__hx_switch(&S.main_sp, f->sp);
#else
    swapcontext(&S.main_uc, &f->uc);
#endif
#ifdef HX_ASAN
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
    S.cur = nullptr;
}

/* From the running fiber back to the scheduler. */
void to_main(fiber *f)
{
#ifdef HX_ASAN
    __sanitizer_start_switch_fiber(&f->fake, S.main_bottom, S.main_size);
#endif
#ifdef HX_TSAN
    __tsan_switch_to_fiber(S.tsan_main, 0);
#endif
#if defined(__x86_64__)
    ndm__hx_switch(&f->sp, S.main_sp);
#else
    swapcontext(&f->uc, &S.main_uc);
#endif
#ifdef HX_ASAN
    __sanitizer_finish_switch_fiber(f->fake, &S.main_bottom, &S.main_size);
#endif
}

void fiber_entry()
{
#ifdef HX_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &S.main_bottom, &S.main_size);
#endif
    fiber *f = S.cur;
    for (;;) {
        if (_setjmp(f->trap) == 0) {
            while (S.next_start < S.nthreads && !S.failed) {
                int t = S.next_start++;
                f->linear = t;
                f->tid.x = (unsigned)t % S.block.x;
                f->tid.y = (unsigned)t / S.block.x % S.block.y;
                f->tid.z = (unsigned)t / (S.block.x * S.block.y);
                ndm__hx_threadIdx = f->tid;
                S.body(S.ctx);
                S.live--;
            }
        }
        /* out of threads, or the launch failed (a trap lands here) */
        f->state = IDLE;
        to_main(f);
    }
}

/* The running thread reaches barrier b, which completes when `expected`
 * threads have reached it (counting *gen, when given); the last one goes on
 * without a switch. */
void arrive(barrier &b, int expected, unsigned *gen)
{
    if (b.arrived == 0)
        b.expected = expected;
    if (++b.arrived >= b.expected) {
        if (gen)
            ++*gen;
        for (fiber *w : b.waiters) {
            w->state = RUNNABLE;
            S.runnable.push_back(w);
        }
        b.waiters.clear();
        b.arrived = 0;
        return;
    }
    fiber *f = S.cur;
    f->state = WAITING;
    b.waiters.push_back(f);
    S.parks++;
    to_main(f);
}

/* Lanes of warp w that exist in this block. */
unsigned warp_lanes(int w)
{
    int n = S.nthreads - w * 32;
    return n >= 32 ? 0xffffffffu : (1u << n) - 1;
}

void warp_arrive(int w, unsigned mask)
{
    arrive(S.warp_bar[w], __builtin_popcount(mask & warp_lanes(w)), &S.warp_gen[w]);
}

void fail_launch(const char *fmt, unsigned a, unsigned b, unsigned c, unsigned d, unsigned e,
                 unsigned g)
{
    if (!S.failed)
        snprintf(S.why, sizeof S.why, fmt, a, b, c, d, e, g);
    S.failed = true;
}

} // namespace

void __syncthreads(void)
{
    if (S.cur)
        arrive(S.block_bar, S.nthreads, nullptr);
}

void __syncwarp(unsigned mask)
{
    if (S.cur)
        warp_arrive(S.cur->linear >> 5, mask);
}

uint64_t ndm__hx_warp_exchange(unsigned mask, uint64_t v, int (*pick)(int, int, int), int a,
                               int width)
{
    fiber *f = S.cur;
    if (!f)
        return v;
    if (width < 1 || width > 32 || (width & (width - 1)))
        width = 32; /* undefined in CUDA; the whole warp here */
    int lane = f->linear & 31, w = f->linear >> 5;
    uint64_t *slot = &S.slots[((size_t)w * 2 + (S.warp_gen[w] & 1)) * 32];
    /* Two generations of slots: a fast lane's next exchange writes the
     * other half, and the one after waits for this one's barrier. */
    slot[lane] = v;
    warp_arrive(w, mask);
    int src = pick(lane, a, width);
    return src < 0 || src > 31 ? v : slot[src];
}

unsigned __ballot_sync(unsigned mask, int predicate)
{
    fiber *f = S.cur;
    if (!f)
        return predicate ? 1u : 0u;
    int lane = f->linear & 31, w = f->linear >> 5;
    uint64_t *slot = &S.slots[((size_t)w * 2 + (S.warp_gen[w] & 1)) * 32];
    slot[lane] = predicate != 0;
    warp_arrive(w, mask);
    unsigned out = 0, m = mask & warp_lanes(w);
    for (int l = 0; l < 32; l++)
        if ((m >> l & 1) && slot[l])
            out |= 1u << l;
    return out;
}

extern "C" unsigned long long ndm__hx_parks(void) { return S.parks; }

int ndm__hx_lane(void) { return S.cur ? S.cur->linear & 31 : 0; }

void *ndm__hx_dyn_shared(void) { return S.dyn; }

void __trap(void)
{
    fiber *f = S.cur;
    if (!f) {
        fprintf(stderr, "host execution: __trap() outside a kernel\n");
        abort();
    }
    fail_launch("__trap() in block (%u,%u,%u), thread (%u,%u,%u)", ndm__hx_blockIdx.x,
                ndm__hx_blockIdx.y, ndm__hx_blockIdx.z, f->tid.x, f->tid.y, f->tid.z);
    _longjmp(f->trap, 1);
}

bool ndm__hx::run_grid(dim3 grid, dim3 block, size_t shmem, void (*body)(void *), void *ctx,
                       char *why, size_t why_len)
{
    if (S.active) {
        snprintf(why, why_len, "a kernel was launched from inside a kernel");
        return false;
    }
    S.active = true;
    S.failed = false;
    S.why[0] = '\0';
    S.body = body;
    S.ctx = ctx;
    S.block = block;
    S.nthreads = (int)(block.x * block.y * block.z);
    int nwarps = (S.nthreads + 31) / 32;
    S.warp_bar.assign((size_t)nwarps, barrier());
    S.warp_gen.assign((size_t)nwarps, 0);
    S.slots.assign((size_t)nwarps * 64, 0);
    size_t dyn_need = shmem ? (shmem + 63) / 64 * 64 : 64;
    if (dyn_need > S.dyn_cap) {
        free(S.dyn);
        S.dyn = (unsigned char *)aligned_alloc(64, dyn_need);
        S.dyn_cap = S.dyn ? dyn_need : 0;
        if (!S.dyn) {
            snprintf(why, why_len, "no host memory for %zu bytes of shared memory", shmem);
            S.active = false;
            return false;
        }
    }
    ndm__hx_gridDim = grid;
    ndm__hx_blockDim = block;
#ifdef HX_TSAN
    S.tsan_main = __tsan_get_current_fiber();
#endif
    for (unsigned bz = 0; bz < grid.z && !S.failed; bz++)
        for (unsigned by = 0; by < grid.y && !S.failed; by++)
            for (unsigned bx = 0; bx < grid.x && !S.failed; bx++) {
                ndm__hx_blockIdx = uint3{bx, by, bz};
                S.next_start = 0;
                S.live = S.nthreads;
                S.block_bar = barrier();
                for (barrier &b : S.warp_bar)
                    b = barrier();
                S.runnable.clear();
                /* CUDA leaves shared memory undefined: a kernel that reads
                 * it before writing sees NaNs and -1s, not zeros. */
                memset(S.dyn, 0xff, shmem);
                while (!S.failed) {
                    fiber *f;
                    if (!S.runnable.empty()) {
                        f = S.runnable.front();
                        S.runnable.pop_front();
                    } else if (S.next_start < S.nthreads) {
                        if (!S.idle.empty()) {
                            f = S.idle.back();
                            S.idle.pop_back();
                        } else if (!(f = new_fiber())) {
                            fail_launch("no host memory for a fiber stack (%u of %u threads)",
                                        (unsigned)S.next_start, (unsigned)S.nthreads, 0, 0, 0, 0);
                            break;
                        }
                    } else {
                        break;
                    }
                    to_fiber(f);
                    if (f->state == IDLE)
                        S.idle.push_back(f);
                }
                if (!S.failed && S.live > 0) {
                    int waiting = S.block_bar.arrived;
                    fail_launch("block (%u,%u,%u): %u of its %u threads wait at a barrier that the "
                                "others never reach (%u waiting at __syncthreads)",
                                bx, by, bz, (unsigned)S.live, (unsigned)S.nthreads,
                                (unsigned)waiting);
                }
            }
    if (S.failed) {
        /* Parked fibers hold frames of a kernel that will never resume. */
        for (fiber *f : S.all)
            if (f->state != IDLE) {
                f->state = IDLE;
                f->fresh = true;
                S.idle.push_back(f);
            }
        S.runnable.clear();
        snprintf(why, why_len, "%s", S.why);
    }
    S.active = false;
    S.cur = nullptr;
    return !S.failed;
}
