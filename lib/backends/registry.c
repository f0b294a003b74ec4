/* The backend registry: the CPU tables built in, the CUDA backend loaded from
 * libndm-cuda.so on first use, and what the allocator learns of its devices. */
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../base/error.h"
#include "../base/segment.h"
#include "ndm/config.h"
#include "cpu/isa.h"
#include "registry.h"

/* ---- the CPU ---------------------------------------------------------------- */

atomic_bool ndm__cpu_reference_forced;

void ndm__cpu_force_reference(bool on) { atomic_store(&ndm__cpu_reference_forced, on); }

/* ---- modules ---------------------------------------------------------------- */

static ndm_status host_vfail(ndm_status st, const char *fmt, va_list ap)
{
    return ndm__vfail(st, NULL, NDM__NO_SITE, fmt, ap);
}

static const ndm__host_api host_api = {
    .abi = NDM__BACKEND_ABI,
    .vfail = host_vfail,
    .dtype_size = ndm_dtype_size,
    .dtype_valid = ndm_dtype_valid,
    .scratch_alloc = ndm__scratch_alloc,
    .scratch_free = ndm__scratch_free,
};

/* The CUDA slot: set once, by the loader or by the test hook, and never
 * cleared (a loaded module stays loaded: its tables and the memory it
 * handed out live as long as the process). */
static _Atomic(const ndm__backend *) cuda_table;
static pthread_once_t cuda_once = PTHREAD_ONCE_INIT;
/* Why the module could not be loaded; written inside cuda_once only. */
static char cuda_why[640];

/* A table a library of this ABI can call: what it must have, it has. */
static const char *table_fault(const ndm__backend *b, ndm_device_type type)
{
    if (b->abi != NDM__BACKEND_ABI)
        return "its table is of another ABI";
    if (b->type != type)
        return "its table is for another device type";
    if (!b->name || !b->device_count || !b->segment_source || !b->copy || !b->fill || !b->iota ||
        !b->upload || !b->download)
        return "its table lacks a required member";
    const ndm__backend_collective *c = b->collective;
    if (c && (!c->id_bytes || c->id_bytes > NDM__COLL_ID_MAX || !c->unique_id || !c->comm_new ||
              !c->comm_free || !c->all_reduce || !c->broadcast || !c->all_gather ||
              !c->reduce_scatter))
        return "its collective table lacks a member or has an id of 0 or more than 256 bytes";
    return NULL;
}

/* Append "; <text>" to cuda_why, keeping the start when it is full. */
static void why_add(const char *fmt, ...) NDM_PRINTF(1, 2);
static void why_add(const char *fmt, ...)
{
    size_t len = strlen(cuda_why);
    if (len + 4 >= sizeof cuda_why)
        return;
    if (len)
        len += (size_t)snprintf(cuda_why + len, sizeof cuda_why - len, "; ");
    if (len >= sizeof cuda_why)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cuda_why + len, sizeof cuda_why - len, fmt, ap);
    va_end(ap);
}

/* The ELF machine of this process, 0 where the check is left to the loader. */
#if defined(__x86_64__)
#define HOST_MACHINE EM_X86_64
#elif defined(__aarch64__)
#define HOST_MACHINE EM_AARCH64
#elif defined(__powerpc64__)
#define HOST_MACHINE EM_PPC64
#else
#define HOST_MACHINE 0
#endif

/* end = off + count * size, false when that overflows or passes `limit`. */
static bool table_fits(uint64_t off, uint64_t count, uint64_t size, uint64_t limit,
                       uint64_t *end)
{
    if (count && size > (UINT64_MAX - off) / count)
        return false;
    *end = off + count * size;
    return *end <= limit;
}

/* Why the file at `path` would fault inside dlopen, or NULL to let dlopen
 * judge it. The loader maps a module's segments where its headers say: a
 * file shorter than they claim (a copy cut short, a full disk) is mapped
 * past its end, and the first touch of those pages is SIGBUS. So the
 * headers are read here first, and what they place must lie in the file.
 * A file without the ELF magic, or one that cannot be opened, is left to
 * dlopen, whose message says why. */
static const char *module_fault(const char *path, char *why, size_t n)
{
    /* O_NONBLOCK: a FIFO under the name must not hang the search. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return NULL;
    struct stat st;
    const char *fault = NULL;
    ElfW(Ehdr) eh;
    ElfW(Phdr) ph;
    uint64_t size = 0, end = 0;
    if (fstat(fd, &st) != 0) {
        snprintf(why, n, "cannot stat it: %s", strerror(errno));
        fault = why;
        goto done;
    }
    if (!S_ISREG(st.st_mode)) {
        fault = "not a regular file";
        goto done;
    }
    size = (uint64_t)st.st_size;
    ssize_t got = pread(fd, &eh, sizeof eh, 0);
    if (got < SELFMAG || memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0)
        goto done; /* not ELF at all: the loader says so */
    if ((size_t)got < sizeof eh) {
        snprintf(why, n, "a damaged ELF file: %llu bytes, shorter than its %zu-byte header",
                 (unsigned long long)size, sizeof eh);
        fault = why;
        goto done;
    }
    if (eh.e_ident[EI_CLASS] != (sizeof(void *) == 8 ? ELFCLASS64 : ELFCLASS32)) {
        snprintf(why, n, "an ELF file of another class (%d-bit objects are loaded here)",
                 (int)(8 * sizeof(void *)));
        fault = why;
        goto done;
    }
    if (HOST_MACHINE && eh.e_machine != HOST_MACHINE) {
        snprintf(why, n, "an ELF file for another machine (e_machine %u, this process is %u)",
                 (unsigned)eh.e_machine, (unsigned)HOST_MACHINE);
        fault = why;
        goto done;
    }
    if (eh.e_phentsize != sizeof ph || !eh.e_phnum ||
        !table_fits(eh.e_phoff, eh.e_phnum, eh.e_phentsize, size, &end)) {
        snprintf(why, n, "a damaged ELF file: its %u program headers at byte %llu do not fit in its "
                 "%llu bytes (truncated?)",
                 (unsigned)eh.e_phnum, (unsigned long long)eh.e_phoff, (unsigned long long)size);
        fault = why;
        goto done;
    }
    if ((eh.e_shoff || eh.e_shnum) &&
        !table_fits(eh.e_shoff, eh.e_shnum ? eh.e_shnum : 1, eh.e_shentsize, size, &end)) {
        snprintf(why, n, "a damaged ELF file: its section headers end at byte %llu, past its %llu "
                 "bytes (truncated?)",
                 (unsigned long long)eh.e_shoff + (unsigned long long)eh.e_shnum * eh.e_shentsize,
                 (unsigned long long)size);
        fault = why;
        goto done;
    }
    for (unsigned i = 0; i < eh.e_phnum; i++) {
        if (pread(fd, &ph, sizeof ph, (off_t)(eh.e_phoff + (uint64_t)i * sizeof ph)) !=
            (ssize_t)sizeof ph) {
            snprintf(why, n, "cannot read program header %u", i);
            fault = why;
            goto done;
        }
        if (ph.p_type == PT_LOAD && !table_fits(ph.p_offset, 1, ph.p_filesz, size, &end)) {
            snprintf(why, n, "a damaged ELF file: its segment %u ends at byte %llu, past its %llu "
                     "bytes (truncated?)",
                     i, (unsigned long long)ph.p_offset + (unsigned long long)ph.p_filesz,
                     (unsigned long long)size);
            fault = why;
            goto done;
        }
    }
done:
    close(fd);
    return fault;
}

/* Open `path` as the CUDA module and take its table; false with the reason
 * added to cuda_why. A file that is there but cannot serve is closed again
 * (a later directory may hold a good one). */
static bool try_module(const char *path)
{
    char why[256];
    const char *damage = strchr(path, '/') ? module_fault(path, why, sizeof why) : NULL;
    if (damage) {
        why_add("%s: %s", path, damage);
        return false;
    }
    dlerror();
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        why_add("%s", e ? e : path);
        return false;
    }
    ndm__backend_entry entry;
    *(void **)&entry = dlsym(h, NDM__CUDA_ENTRY);
    if (!entry) {
        why_add("%s: no entry point %s", path, NDM__CUDA_ENTRY);
        dlclose(h);
        return false;
    }
    const ndm__backend *b = entry(&host_api);
    const char *fault = b ? table_fault(b, NDM_DEVICE_CUDA) : NULL;
    if (!b || fault) {
        if (b && b->abi != NDM__BACKEND_ABI)
            why_add("%s: built for backend ABI %u, this libndm has ABI %u", path, (unsigned)b->abi,
                    (unsigned)NDM__BACKEND_ABI);
        else
            why_add("%s: %s", path, fault ? fault : "its entry point refused this libndm");
        dlclose(h);
        return false;
    }
    atomic_store_explicit(&cuda_table, b, memory_order_release);
    return true;
}

#if NDM_HAVE_CUDA
/* The directory of the file this code was loaded from (libndm.so, or the
 * program that linked the static archive); false when unknown. */
static bool own_dir(char *buf, size_t n)
{
    Dl_info info;
    if (!dladdr((void *)ndm__backend_for, &info) || !info.dli_fname || !*info.dli_fname)
        return false;
    const char *slash = strrchr(info.dli_fname, '/');
    if (!slash)
        return false;
    int k = snprintf(buf, n, "%.*s", (int)(slash - info.dli_fname), info.dli_fname);
    return k > 0 && (size_t)k < n;
}
#endif

static bool try_in(const char *dir, size_t len)
{
    char path[4096];
    int k = snprintf(path, sizeof path, "%.*s/%s", (int)len, dir, NDM__CUDA_MODULE);
    return k > 0 && (size_t)k < sizeof path && try_module(path);
}

/* NDM_BACKEND_PATH (a directory or a colon-separated list), then, in a build
 * with the CUDA backend, the directory of libndm itself and the loader's
 * default search. */
static void load_cuda(void)
{
    if (atomic_load_explicit(&cuda_table, memory_order_acquire))
        return; /* a stand-in was registered */
    const char *env = getenv("NDM_BACKEND_PATH");
    if (env && *env) {
        for (const char *p = env; *p;) {
            size_t len = strcspn(p, ":");
            if (len && try_in(p, len))
                return;
            p += len + (p[len] == ':');
        }
    }
#if NDM_HAVE_CUDA
    char dir[4096];
    if (own_dir(dir, sizeof dir) && try_in(dir, strlen(dir)))
        return;
    if (try_module(NDM__CUDA_MODULE))
        return;
    /* Bounded so that the whole fits the buffer: the reasons come last. */
    char tmp[sizeof cuda_why];
    snprintf(tmp, sizeof tmp, "%s", cuda_why);
    snprintf(cuda_why, sizeof cuda_why,
             "the CUDA backend module %s could not be loaded (looked in NDM_BACKEND_PATH=%.100s, "
             "beside libndm, and on the loader's path): %.400s",
             NDM__CUDA_MODULE, env && *env ? env : "(unset)", tmp);
#else
    /* No module was built beside this libndm; one that NDM_BACKEND_PATH
     * names is still loaded (the tests' host execution of the CUDA path). */
    char tmp[sizeof cuda_why];
    snprintf(tmp, sizeof tmp, "%s", cuda_why);
    if (env && *env)
        snprintf(cuda_why, sizeof cuda_why,
                 "this build of ndm has no CUDA backend, and NDM_BACKEND_PATH=%.100s holds no "
                 "loadable %s: %.400s",
                 env, NDM__CUDA_MODULE, tmp);
    else
        snprintf(cuda_why, sizeof cuda_why, "this build of ndm has no CUDA backend");
#endif
}

const ndm__backend *ndm__backend_for(ndm_device_type type)
{
    switch (type) {
    case NDM_DEVICE_CPU:
        return atomic_load_explicit(&ndm__cpu_reference_forced, memory_order_relaxed) ? &ndm__cpu_ref_backend
                                                                            : &ndm__cpu_backend;
    case NDM_DEVICE_CUDA: {
        const ndm__backend *b = atomic_load_explicit(&cuda_table, memory_order_acquire);
        if (b)
            return b;
        pthread_once(&cuda_once, load_cuda);
        return atomic_load_explicit(&cuda_table, memory_order_acquire);
    }
    }
    return NULL;
}

const char *ndm__backend_unavailable(ndm_device_type type)
{
    if (ndm__backend_for(type))
        return "";
    if (type == NDM_DEVICE_CUDA)
        return cuda_why;
    return "unknown device type";
}

int ndm__backend_device_count(ndm_device_type type)
{
    if (type == NDM_DEVICE_CPU)
        return 1;
    const ndm__backend *b = ndm__backend_for(type);
    return b ? b->device_count() : 0;
}

NDM_API int ndm_cuda_device_count(void) { return ndm__backend_device_count(NDM_DEVICE_CUDA); }

/* The CPU's model name from /proc/cpuinfo ("" when not there). */
static void cpu_model(char *buf, size_t n)
{
    buf[0] = '\0';
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) != 0)
            continue;
        const char *v = strchr(line, ':');
        if (v) {
            v += 1 + (v[1] == ' ');
            snprintf(buf, n, "%.*s", (int)strcspn(v, "\n"), v);
        }
        break;
    }
    fclose(f);
}

static void cpu_props(ndm__device_props *out)
{
    cpu_model(out->name, sizeof out->name);
    if (!out->name[0])
        snprintf(out->name, sizeof out->name, "cpu");
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    out->memory_bytes = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
    ndm__cpu_features_str(out->features, sizeof out->features);
}

ndm_status ndm__backend_device_props(ndm_device dev, ndm__device_props *out)
{
    memset(out, 0, sizeof *out);
    char name[32];
    ndm_device_str(dev, name, sizeof name);
    const ndm__backend *b = ndm__backend_for(dev.type);
    if (!b)
        return ndm__fail(NDM_E_UNSUPPORTED, NULL, NDM__NO_SITE, "device %s: %s", name,
                         ndm__backend_unavailable(dev.type));
    int count = ndm__backend_device_count(dev.type);
    if (dev.index < 0 || dev.index >= count)
        return ndm__fail(NDM_E_DEVICE, NULL, NDM__NO_SITE, "device %s does not exist", name);
    if (dev.type == NDM_DEVICE_CPU) {
        cpu_props(out);
        return NDM_OK;
    }
    if (!b->device_props) {
        snprintf(out->name, sizeof out->name, "%s", b->name);
        return NDM_OK;
    }
    return b->device_props(dev.index, out);
}

bool ndm__backend_declines(const ndm__backend *b, ndm_device dev, const ndm__op_case *c,
                           const char *api, const char *file, const char *func, int line)
{
    if (!b->supports || b->supports(dev.index, c))
        return false;
    char name[32], types[8 * NDM__OP_MAX_OPERANDS + 1] = "";
    size_t len = 0;
    for (int i = 0; i < c->ndtypes && i < NDM__OP_MAX_OPERANDS; i++)
        len += (size_t)snprintf(types + len, sizeof types - len, "%s%s", i ? "," : "",
                                ndm_dtype_short(c->dtypes[i]));
    ndm__site where = {file, func, line};
    ndm__fail(NDM_E_UNSUPPORTED, api, where, "%s (%s%s%s) on %s is not supported by the %s backend",
              c->name, types, c->layout & NDM__LAYOUT_STRIDED ? " (strided)" : "",
              c->layout & NDM__LAYOUT_BROADCAST ? " (broadcast)" : "",
              ndm_device_str(dev, name, sizeof name), b->name);
    return true;
}

ndm_status ndm__backend_register(const ndm__backend *b)
{
    if (!b || b->type == NDM_DEVICE_CPU)
        return ndm__fail(NDM_E_INVALID, NULL, NDM__NO_SITE, "only a non-CPU backend registers");
    const char *fault = table_fault(b, b->type);
    if (fault)
        return ndm__fail(NDM_E_INVALID, NULL, NDM__NO_SITE, "backend %s: %s",
                         b->name ? b->name : "(unnamed)", fault);
    atomic_store_explicit(&cuda_table, b, memory_order_release);
    return NDM_OK;
}

/* ---- the allocator's view of the CUDA devices ------------------------------------- */

static ndm_status cuda_usable(int index, char *why, size_t n)
{
    const ndm__backend *b = ndm__backend_for(NDM_DEVICE_CUDA);
    if (!b) {
        snprintf(why, n, "device cuda:%d: %s", index, cuda_why);
        return NDM_E_UNSUPPORTED;
    }
    int count = b->device_count();
    if (index < 0 || index >= count) {
        snprintf(why, n, "device cuda:%d does not exist (%d CUDA device%s found)", index, count,
                 count == 1 ? "" : "s");
        return NDM_E_DEVICE;
    }
    return NDM_OK;
}

static const ndm__segment_source *cuda_source(int index)
{
    const ndm__backend *b = atomic_load_explicit(&cuda_table, memory_order_acquire);
    return b ? b->segment_source(index) : NULL;
}

static const ndm__segment_source *cuda_pinned_source(int index)
{
    const ndm__backend *b = atomic_load_explicit(&cuda_table, memory_order_acquire);
    return b && b->pinned_source ? b->pinned_source(index) : NULL;
}

static const ndm__device_memory cuda_memory = {cuda_usable, cuda_source, cuda_pinned_source};

/* Registered when the library is loaded (or the program that links the
 * archive starts), before any allocation can ask about a CUDA device. */
__attribute__((constructor)) static void register_device_memory(void)
{
    ndm__device_memory_register(NDM_DEVICE_CUDA, &cuda_memory);
}
