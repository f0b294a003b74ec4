/* ndm-memviz: the reader's errors on malformed snapshots, the totals it plots,
 * and its page rendered in headless Chromium (skipped when Chromium is absent).
 * Hostile snapshots (cycles, deep nesting, shared references, overflowing
 * sums) are refused within bounds set by their size.
 * Arguments: the ndm-memviz program, the fixture folder, Chromium's path or "",
 * python3 (it writes PyTorch-shaped pickles). */
#include <fcntl.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "child_run.h"

static const char *memviz, *data_dir, *chromium, *python;
static char tmp_dir[64];

/* Run a shell command; returns its exit status and its output (stdout and
 * stderr, caller frees). */
static int run(const char *cmd, char **output)
{
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    assert_non_null(buf);
    for (;;) {
        n += fread(buf + n, 1, cap - n - 1, p);
        if (n < cap - 1)
            break;
        cap *= 2;
        buf = realloc(buf, cap);
        assert_non_null(buf);
    }
    buf[n] = '\0';
    int st = pclose(p);
    *output = buf;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int memviz_run(const char *in, const char *out, char **output)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' '%s' '%s' 2>&1", memviz, in, out);
    return run(cmd, output);
}

static char *read_all(const char *path)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    return file_slurp(f);
}

static int count(const char *hay, const char *needle)
{
    int k = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle))
        k++;
    return k;
}

/* The page of the shared fixture, written into tmp_dir; caller frees. */
static char *fixture_page(char *path, size_t n)
{
    char in[1024], *out;
    snprintf(in, sizeof in, "%s/memviz_snapshot.json", data_dir);
    snprintf(path, n, "%s/snapshot.html", tmp_dir);
    int rc = memviz_run(in, path, &out);
    if (rc != 0)
        fail_msg("ndm-memviz exited with %d: %s", rc, out);
    free(out);
    return read_all(path);
}

/* Chromium's DOM after the page's scripts ran. */
static char *rendered_dom(const char *page)
{
    char cmd[4096], *out;
    snprintf(cmd, sizeof cmd,
             "HOME='%s' timeout 120 '%s' --headless --no-sandbox --disable-gpu "
             "--user-data-dir='%s/profile' --dump-dom 'file://%s' 2>/dev/null",
             tmp_dir, chromium, tmp_dir, page);
    int rc = run(cmd, &out);
    if (rc != 0)
        fail_msg("chromium exited with %d", rc);
    return out;
}

#define NEED_CHROMIUM()                                                         \
    do {                                                                        \
        if (!chromium || !*chromium) {                                          \
            print_message("chromium not found: skipped\n");                    \
            skip();                                                             \
        }                                                                       \
    } while (0)

/* batch-1 and batch-2 fold into one series, batch-* */
static const char *const fixture_managers[] = {"system/model", "system/model/trainer/batch-*",
                                               "system/data"};

static void test_memviz_page_renders_every_manager_in_chromium(void **state)
{
    (void)state;
    NEED_CHROMIUM();
    char path[256];
    free(fixture_page(path, sizeof path));
    char *dom = rendered_dom(path);
    /* 3 series on the CPU, 2 on cuda:0; 5 + 1 + 3 blocks in 3 segments */
    if (!strstr(dom, "data-rendered=\"1\""))
        fail_msg("the page did not finish drawing:\n%.2000s", dom);
    assert_non_null(strstr(dom, "data-series=\"5\""));
    assert_non_null(strstr(dom, "data-blocks=\"9\""));
    assert_non_null(strstr(dom, "data-segments=\"3\""));
    assert_int_equal(count(dom, "class=\"series\""), 5);
    assert_int_equal(count(dom, "class=\"timeline\""), 2);
    for (size_t k = 0; k < sizeof fixture_managers / sizeof *fixture_managers; k++) {
        char want[160];
        snprintf(want, sizeof want, "class=\"series\" data-manager=\"%s\"", fixture_managers[k]);
        if (!strstr(dom, want))
            fail_msg("no series path for %s", fixture_managers[k]);
    }
    assert_int_equal(count(dom, "class=\"series\" data-manager=\"system/model\""), 2);
    assert_null(strstr(dom, "class=\"series\" data-manager=\"system/model/trainer/batch-1\""));
    assert_int_equal(count(dom, "class=\"series\" data-manager=\"system/data\""), 1);
    /* a path per series with a real outline, and the blocks by state */
    assert_non_null(strstr(dom, "<path d=\"M"));
    assert_int_equal(count(dom, "data-state=\"active_allocated\""), 5);
    assert_int_equal(count(dom, "data-state=\"active_pending_free\""), 1);
    assert_int_equal(count(dom, "data-state=\"inactive\""), 3);
    assert_non_null(strstr(dom, "data-state=\"active_pending_free\" "
                                "data-manager=\"system/model/trainer/batch-1\""));
    assert_non_null(strstr(dom, "class=\"oom\""));
    free(dom);
}

static void test_memviz_totals_follow_allocs_and_frees(void **state)
{
    (void)state;
    char path[256];
    char *page = fixture_page(path, sizeof path);
    /* Series come by falling peak. data peaks with its 10 MiB block; a block
     * freed twice (free_requested, then free_completed) counts once; batch-1
     * and batch-2 are one series, batch-* (two 512-byte blocks of batch-1). */
    assert_non_null(strstr(page, "{\"manager\":\"system/data\",\"peak\":10487808}"));
    assert_non_null(strstr(page, "{\"manager\":\"system/model\",\"peak\":1024}"));
    assert_non_null(strstr(page, "{\"manager\":\"system/model/trainer/batch-*\",\"peak\":1024}"));
    assert_null(strstr(page, "batch-2\",\"peak\""));
    assert_non_null(strstr(page, "{\"manager\":\"system/model\",\"peak\":8388608}"));
    assert_non_null(
        strstr(page, "{\"manager\":\"system/model/trainer/batch-*\",\"peak\":4194304}"));
    /* The CPU's last point: data 2048, model 1024, batch-* 512;
     * reserved 2 MiB + 20 MiB; one OOM at 1800 us. */
    const char *cpu = strstr(page, "{\"device\":\"cpu\"");
    assert_non_null(cpu);
    const char *values = strstr(cpu, "\"values\":[");
    const char *end = values ? strchr(values, ']') : NULL;
    assert_non_null(end);
    assert_true(end - values > 20);
    assert_memory_equal(end - 13, "2048,1024,512]", 14);
    const char *reserved = strstr(cpu, "\"reserved\":[");
    const char *rend = reserved ? strchr(reserved, ']') : NULL;
    assert_non_null(rend);
    assert_memory_equal(rend - 9, ",23068672", 9);
    assert_non_null(strstr(cpu, "\"ooms\":[1800]"));
    assert_non_null(strstr(cpu, "\"peak_total\":10489856")); /* at 1660 us */
    assert_non_null(strstr(cpu, "\"unknown_frees\":0"));
    /* the settings pass through */
    assert_non_null(strstr(page, "\"strategy\":\"auto_growth\""));
    free(page);
}

static void test_memviz_page_fetches_nothing(void **state)
{
    (void)state;
    char path[256];
    char *page = fixture_page(path, sizeof path);
    assert_null(strstr(page, "src="));
    assert_null(strstr(page, "href="));
    assert_null(strstr(page, "<link"));
    assert_null(strstr(page, "@import"));
    assert_null(strstr(page, "url("));
    /* the one "http" is SVG's namespace name, which is never fetched */
    assert_int_equal(count(page, "http"), 1);
    assert_non_null(strstr(page, "'http://www.w3.org/2000/svg'"));
    free(page);
}

static void test_memviz_hostile_names_stay_text(void **state)
{
    (void)state;
    NEED_CHROMIUM();
    char in[256], out[256], *msg;
    snprintf(in, sizeof in, "%s/hostile.json", tmp_dir);
    snprintf(out, sizeof out, "%s/hostile.html", tmp_dir);
    FILE *f = fopen(in, "w");
    assert_non_null(f);
    fputs("{\"devices\": [\"cpu\"], \"segments\": [], \"device_traces\": [[\n"
          " {\"action\": \"alloc\", \"addr\": 64, \"size\": 8, \"time_us\": 1,\n"
          "  \"manager\": \"</script><img src=x onerror=\\\"document.title='owned'\\\">\"},\n"
          " {\"action\": \"alloc\", \"addr\": 128, \"size\": 8, \"time_us\": 2,\n"
          "  \"manager\": \"sys/\\u00e9t\\u00e9 \\ud83d\\ude00 \\u2028 & <b>\"}]]}\n",
          f);
    fclose(f);
    int rc = memviz_run(in, out, &msg);
    if (rc != 0)
        fail_msg("ndm-memviz exited with %d: %s", rc, msg);
    free(msg);
    char *dom = rendered_dom(out);
    assert_non_null(strstr(dom, "data-rendered=\"1\""));
    assert_non_null(strstr(dom, "data-series=\"2\""));
    assert_null(strstr(dom, "<img"));
    assert_null(strstr(dom, "<b>"));
    assert_non_null(strstr(dom, "<title>ndm memory snapshot</title>")); /* no handler ran */
    assert_non_null(strstr(dom, "&lt;/script&gt;&lt;img src=x"));
    assert_non_null(strstr(dom, "sys/\xc3\xa9t\xc3\xa9 \xf0\x9f\x98\x80"));
    free(dom);
}

typedef struct bad_case {
    const char *file, *message;
} bad_case;

static void test_memviz_rejects_malformed_snapshots(void **state)
{
    (void)state;
    static const bad_case cases[] = {
        {"memviz_bad_truncated.json", "line 1, column 35: unexpected end of input"},
        {"memviz_bad_trailing_comma.json", "line 1, column 20: trailing comma before ']'"},
        {"memviz_bad_escape.json", "line 2, column 35: invalid escape '\\x'"},
        {"memviz_bad_segments_type.json", "\"segments\" must be an array (found an object)"},
        {"memviz_bad_traces_count.json", "\"device_traces\" has 1 list for 2 devices"},
        {"memviz_bad_block_size.json",
         "segments[0].blocks[1].\"size\" must be a non-negative integer (found a string)"},
        {"memviz_bad_number.json", "invalid number: leading zero"},
        {"memviz_bad_negative.json", "device_traces[0][0].\"addr\" must be a non-negative "
                                     "integer (found -5)"},
        {"memviz_bad_nesting.json", "nested too deeply"},
        {"memviz_bad_empty.json", "the file is empty"},
        {"memviz_bad_trailing_text.json", "unexpected text after the snapshot object"},
        {"memviz_no_such_file.json", "cannot open: No such file or directory"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        char in[1024], out[256], *msg;
        snprintf(in, sizeof in, "%s/%s", data_dir, cases[k].file);
        snprintf(out, sizeof out, "%s/bad-%zu.html", tmp_dir, k);
        int rc = memviz_run(in, out, &msg);
        if (rc != 1 || !strstr(msg, cases[k].message) || !strstr(msg, cases[k].file))
            fail_msg("%s: exit %d, message \"%s\"; expected exit 1 and \"%s\"", cases[k].file, rc,
                     msg, cases[k].message);
        free(msg);
        struct stat sb;
        assert_int_not_equal(stat(out, &sb), 0); /* no page, not even half of one */
    }
}

static void test_memviz_usage_is_exit_2(void **state)
{
    (void)state;
    char cmd[1024], *msg;
    snprintf(cmd, sizeof cmd, "'%s' only-one-argument 2>&1", memviz);
    assert_int_equal(run(cmd, &msg), 2);
    assert_non_null(strstr(msg, "usage:"));
    free(msg);
    snprintf(cmd, sizeof cmd, "'%s' --help 2>&1", memviz);
    assert_int_equal(run(cmd, &msg), 0);
    assert_non_null(strstr(msg, "snapshot.json out.html"));
    free(msg);
}

/* End to end: a snapshot written by the library's allocator, of a small
 * training-shaped run, drawn by memviz and rendered by Chromium. */
static void test_memviz_real_snapshot_from_the_allocator(void **state)
{
    assert_ok(ndm_memory_record_history(true, 100000));
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_array w = ndm_ones(model, NDM_F32, NDM_SHAPE(256, 256));
    ndm_manager trainer = ndm_manager_new(model, "trainer");
    for (int step = 0; step < 3; step++) {
        ndm_manager batch = ndm_manager_new(trainer, "batch");
        ndm_array x = ndm_ones(batch, NDM_F32, NDM_SHAPE(64, 256));
        ndm_array h = ndm_relu(ndm_matmul(x, w));
        assert_live(h);
        assert_ok(ndm_manager_close(batch));
    }
    ndm_array keep = ndm_zeros(trainer, NDM_F32, NDM_SHAPE(1000)); /* alive in the snapshot */
    assert_live(keep);
    char json[256], html[256];
    snprintf(json, sizeof json, "%s/real.json", tmp_dir);
    snprintf(html, sizeof html, "%s/real.html", tmp_dir);
    assert_ok(ndm_memory_dump_snapshot(json));
    assert_ok(ndm_memory_record_history(false, 0));
    assert_ok(ndm_manager_close(model));
    char *out;
    int rc = memviz_run(json, html, &out);
    if (rc != 0)
        fail_msg("ndm-memviz exited with %d on the library's snapshot: %s", rc, out);
    free(out);
    char *page = read_all(html);
    assert_non_null(strstr(page, "system/test/model/trainer/batch"));
    assert_non_null(strstr(page, "system/test/model/trainer"));
    free(page);
    NEED_CHROMIUM();
    char *dom = rendered_dom(html);
    if (!strstr(dom, "data-rendered=\"1\""))
        fail_msg("the page did not finish drawing:\n%.2000s", dom);
    assert_non_null(strstr(dom, "class=\"series\" data-manager=\"system/test/model\""));
    assert_non_null(strstr(dom, "class=\"series\" data-manager=\"system/test/model/trainer/batch\""));
    assert_true(count(dom, "data-state=\"active_allocated\"") >= 2); /* w and keep */
    free(dom);
}

/* Chromium's DOM of the fixture's page opened at `hash` ("replay=cpu:8"). */
static char *fixture_dom(const char *hash)
{
    char path[256], url[600];
    free(fixture_page(path, sizeof path));
    snprintf(url, sizeof url, "%s#%s", path, hash);
    char *dom = rendered_dom(url);
    if (!strstr(dom, "data-rendered=\"1\""))
        fail_msg("the page did not finish drawing:\n%.3000s", dom);
    return dom;
}

/* The slider's state after the first k events, replayed backwards from the
 * segments: 8 events in, the large segment is not mapped yet and 4 blocks
 * live; 10 in, the 10 MiB block is live too; every block has its segment. */
static void test_memviz_replay_rewinds_the_segment_map(void **state)
{
    (void)state;
    NEED_CHROMIUM();
    char *dom = fixture_dom("replay=cpu:8");
    assert_non_null(strstr(dom, "class=\"segmap\" data-device=\"cpu\" data-live-blocks=\"4\" "
                                "data-orphans=\"0\" data-event=\"8\""));
    assert_int_equal(count(dom, "class=\"segment\""), 2); /* cpu's small one, cuda's */
    free(dom);
    dom = fixture_dom("replay=cpu:10");
    assert_non_null(strstr(dom, "class=\"segmap\" data-device=\"cpu\" data-live-blocks=\"5\" "
                                "data-orphans=\"0\" data-event=\"10\""));
    assert_int_equal(count(dom, "class=\"segment\""), 3);
    free(dom);
    /* untouched, it shows the snapshot: 4 blocks in use (one pending free) */
    dom = fixture_dom("");
    assert_non_null(strstr(dom, "data-device=\"cpu\" data-live-blocks=\"4\" data-event=\"15\""));
    free(dom);
}

/* Hovering names one allocation: its address and manager, inside the band of
 * its series (per-step managers folded), stacked by address. */
static void test_memviz_hover_names_one_allocation(void **state)
{
    (void)state;
    NEED_CHROMIUM();
    static const struct {
        const char *hash, *addr, *manager;
    } cases[] = {
        {"hover=cpu:1670:5000000", "140240000000", "system/data"},
        {"hover=cpu:1550:600", "140230000000", "system/model"},
        {"hover=cpu:1550:1300", "140230001024", "system/model/trainer/batch-2"},
        {"hover=cpu:1550:1900", "140230001536", "system/model/trainer/batch-1"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        char *dom = fixture_dom(cases[k].hash);
        char want[256];
        snprintf(want, sizeof want, "data-hover-addr=\"%s\" data-hover-manager=\"%s\"",
                 cases[k].addr, cases[k].manager);
        if (!strstr(dom, want))
            fail_msg("%s: no %s in the timeline", cases[k].hash, want);
        free(dom);
    }
}

/* Zoomed to a window of the trace, and segments drawn to scale: 2 MiB is a
 * tenth of the width of 20 MiB. */
static void test_memviz_zoom_and_segments_to_scale(void **state)
{
    (void)state;
    NEED_CHROMIUM();
    char *dom = fixture_dom("zoom=cpu:600:700");
    assert_non_null(strstr(dom, "data-device=\"cpu\" data-view=\"600,700\""));
    assert_non_null(strstr(dom, "width=\"90.0\" height=\"16\" fill=\"#f6f6f6\" stroke=\"#999\" "
                                "class=\"segment\" data-total=\"2097152\""));
    assert_non_null(strstr(dom, "width=\"900.0\" height=\"16\" fill=\"#f6f6f6\" stroke=\"#999\" "
                                "class=\"segment\" data-total=\"20971520\""));
    free(dom);
}

/* PyTorch's own snapshot, pickled by Python (protocol 4, with the memo):
 * devices by index, no manager (the category and user_metadata stand in), an
 * oom entry with device_free. */
static void test_memviz_reads_pytorch_pickles(void **state)
{
    (void)state;
    char in[256], out[256], cmd[4096], *msg;
    snprintf(in, sizeof in, "%s/torch.pickle", tmp_dir);
    snprintf(out, sizeof out, "%s/torch.html", tmp_dir);
    snprintf(cmd, sizeof cmd,
             "'%s' -c \"import pickle\n"
             "fr=[{'filename':'train.py','line':3,'name':'step'}]\n"
             "seg={'device':0,'address':4096,'total_size':2097152,'allocated_size':1024,"
             "'active_size':1024,'requested_size':1000,'stream':0,'segment_type':'small',"
             "'segment_pool_id':(0,0),'is_expandable':False,'frames':[],'blocks':["
             "{'size':1024,'requested_size':1000,'state':'active_allocated','frames':fr},"
             "{'size':2096128,'requested_size':0,'state':'inactive','frames':[]}]}\n"
             "tr=[{'action':'segment_alloc','addr':4096,'size':2097152,'stream':0,"
             "'time_us':10,'frames':fr},"
             "{'action':'alloc','addr':4096,'size':1000,'stream':0,'time_us':11,'frames':fr,"
             "'category':'parameter'},"
             "{'action':'oom','device_free':5,'size':1<<40,'stream':0,'time_us':12,'frames':[]}]\n"
             "d={'segments':[seg],'device_traces':[tr],'allocator_settings':"
             "{'PYTORCH_CUDA_ALLOC_CONF':'','max_split_size':-1,'expandable_segments':False,"
             "'garbage_collection_threshold':0.0,'roundup_power2_divisions':{'1':1}},"
             "'external_annotations':[]}\n"
             "open('%s','wb').write(pickle.dumps(d,protocol=4))\" 2>&1",
             python, in);
    assert_int_equal(run(cmd, &msg), 0);
    free(msg);
    int rc = memviz_run(in, out, &msg);
    if (rc != 0)
        fail_msg("ndm-memviz exited with %d on PyTorch's pickle: %s", rc, msg);
    free(msg);
    char *page = read_all(out);
    assert_non_null(strstr(page, "{\"device\":\"cuda:0\""));
    assert_non_null(strstr(page, "{\"manager\":\"parameter\",\"peak\":1000}"));
    assert_non_null(strstr(page, "\"ooms\":[12]"));
    assert_non_null(strstr(page, "train.py:3 step"));
    free(page);
    /* a pickle that would build an object is refused, not run */
    snprintf(cmd, sizeof cmd,
             "'%s' -c \"import pickle,collections; open('%s','wb').write(pickle.dumps("
             "collections.OrderedDict(a=1),protocol=2))\" 2>&1", python, in);
    assert_int_equal(run(cmd, &msg), 0);
    free(msg);
    assert_int_equal(memviz_run(in, out, &msg), 1);
    if (!strstr(msg, "objects are refused"))
        fail_msg("unexpected message: %s", msg);
    free(msg);
}

/* The output named last is a snapshot when the page's name was forgotten
 * (`ndm-memviz before.json after.json`), or an input under another spelling:
 * refused with exit 2 and the command to type, the file left as it was. An
 * old page is still replaced. */
static void expect_kept(const char *args, const char *path, const char *said)
{
    char cmd[2048], *msg;
    char *before = read_all(path);
    snprintf(cmd, sizeof cmd, "'%s' %s 2>&1", memviz, args);
    int rc = run(cmd, &msg);
    if (rc != 2 || !strstr(msg, said))
        fail_msg("'%s' exited with %d (not 2) or lacks \"%s\": %s", args, rc, said, msg);
    free(msg);
    char *after = read_all(path);
    assert_string_equal(before, after);
    free(before);
    free(after);
    char tmp[512];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    struct stat sb;
    assert_int_not_equal(stat(tmp, &sb), 0);
}

static void test_memviz_never_writes_over_a_snapshot(void **state)
{
    (void)state;
    char a[256], b[256], pk[256], page[256], args[1200], cmd[1200], *msg;
    snprintf(a, sizeof a, "%s/keep-a.json", tmp_dir);
    snprintf(b, sizeof b, "%s/keep-b.json", tmp_dir);
    snprintf(pk, sizeof pk, "%s/keep.pickle", tmp_dir);
    snprintf(page, sizeof page, "%s/keep.html", tmp_dir);
    snprintf(cmd, sizeof cmd, "cp '%s/memviz_snapshot.json' '%s' && cp '%s' '%s'", data_dir, a,
             a, b);
    assert_int_equal(system(cmd), 0);
    FILE *f = fopen(pk, "wb");
    assert_non_null(f);
    fputs("\x80\x04}q\x00.", f); /* a pickle's protocol mark, as ndm's and torch's begin */
    assert_int_equal(fclose(f), 0);

    /* the page's name forgotten: the second snapshot stays, and the message
     * gives the comparison's command */
    snprintf(args, sizeof args, "'%s' '%s'", a, b);
    expect_kept(args, b, "not written over: it holds a JSON snapshot");
    snprintf(cmd, sizeof cmd, "'%s' '%s' '%s' 2>&1", memviz, a, b);
    assert_int_equal(run(cmd, &msg), 2);
    assert_non_null(strstr(msg, "to compare the two snapshots, name the page last:"));
    assert_non_null(strstr(msg, "keep-b.json out.html"));
    free(msg);
    snprintf(args, sizeof args, "'%s' '%s'", a, pk);
    expect_kept(args, pk, "not written over: it holds a pickled snapshot");
    snprintf(args, sizeof args, "'%s' '%s' '%s'", a, b, pk);
    expect_kept(args, pk, "not written over: it holds a pickled snapshot");
    /* an input, named again under another spelling */
    snprintf(args, sizeof args, "'%s' '%s/./keep-a.json'", a, tmp_dir);
    expect_kept(args, a, "not written over: it is one of the snapshots to read");
    snprintf(args, sizeof args, "'%s' '%s' '%s'", a, b, a);
    expect_kept(args, a, "not written over: it is one of the snapshots to read");

    /* a page from an earlier run is replaced, as before */
    f = fopen(page, "w");
    assert_non_null(f);
    fputs("<!DOCTYPE html><p>old</p>\n", f);
    assert_int_equal(fclose(f), 0);
    assert_int_equal(memviz_run(a, page, &msg), 0);
    free(msg);
    char *html = read_all(page);
    assert_null(strstr(html, "<p>old</p>"));
    assert_non_null(strstr(html, "data-rendered"));
    free(html);
}

/* Two snapshots of the library's allocator, before and after a manager
 * kept 4 KiB more: the comparison names it with the change. */
static void test_memviz_compares_two_snapshots(void **state)
{
    assert_ok(ndm_memory_record_history(true, 1000));
    ndm_manager keep = ndm_manager_new(ROOT(state), "keep");
    ndm_array a = ndm_zeros(keep, NDM_F32, NDM_SHAPE(256));
    assert_live(a);
    char before[256], after[256], html_path[256], cmd[1024], *msg;
    snprintf(before, sizeof before, "%s/before.pickle", tmp_dir);
    snprintf(after, sizeof after, "%s/after.json", tmp_dir);
    snprintf(html_path, sizeof html_path, "%s/compare.html", tmp_dir);
    assert_ok(ndm_memory_dump_snapshot(before));
    ndm_manager leaky = ndm_manager_new(ROOT(state), "leaky");
    ndm_array b = ndm_zeros(leaky, NDM_F32, NDM_SHAPE(1024));
    assert_live(b);
    assert_ok(ndm_memory_dump_snapshot(after));
    assert_ok(ndm_memory_record_history(false, 0));
    assert_ok(ndm_manager_close(leaky));
    assert_ok(ndm_manager_close(keep));
    snprintf(cmd, sizeof cmd, "'%s' '%s' '%s' '%s' 2>&1", memviz, before, after, html_path);
    int rc = run(cmd, &msg);
    if (rc != 0)
        fail_msg("ndm-memviz exited with %d comparing: %s", rc, msg);
    free(msg);
    char *page = read_all(html_path);
    assert_non_null(strstr(page, "{\"manager\":\"system/test/leaky\",\"before\":0,\"after\":4096}"));
    assert_non_null(strstr(page, "{\"manager\":\"system/test/keep\",\"before\":1024,\"after\":1024}"));
    free(page);
    NEED_CHROMIUM();
    char *dom = rendered_dom(html_path);
    assert_non_null(strstr(dom, "data-rendered=\"1\""));
    assert_non_null(strstr(dom, "<tr data-manager=\"system/test/leaky\" data-delta=\"4096\">"));
    free(dom);
}

/* A ring that wrapped: the model's weights were allocated long before its
 * window, yet the timeline draws them from the start (the state before the
 * first event is replayed backwards from the segments). */
static void test_memviz_draws_blocks_from_before_the_window(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_array w = ndm_zeros(model, NDM_F32, NDM_SHAPE(256, 1024)); /* 1 MiB */
    assert_live(w);
    assert_ok(ndm_memory_record_history(true, 20));
    ndm_array w2 = ndm_zeros(model, NDM_F32, NDM_SHAPE(1024)); /* then pushed out */
    assert_live(w2);
    for (int step = 0; step < 30; step++) {
        ndm_manager batch = ndm_manager_new(model, "batch");
        assert_live(ndm_ones(batch, NDM_F32, NDM_SHAPE(100)));
        assert_ok(ndm_manager_close(batch));
    }
    char json[256], html_path[256], *out;
    snprintf(json, sizeof json, "%s/wrapped.json", tmp_dir);
    snprintf(html_path, sizeof html_path, "%s/wrapped.html", tmp_dir);
    assert_ok(ndm_memory_dump_snapshot(json));
    assert_ok(ndm_memory_record_history(false, 0));
    assert_ok(ndm_manager_close(model));
    int rc = memviz_run(json, html_path, &out);
    if (rc != 0)
        fail_msg("ndm-memviz exited with %d: %s", rc, out);
    free(out);
    char *page = read_all(html_path);
    /* 1 MiB + 4 KiB of weights, all alive before the window's first event */
    if (!strstr(page, "{\"manager\":\"system/test/model\",\"peak\":1052672}"))
        fail_msg("the model's weights are missing from the timeline:\n%.600s",
                 strstr(page, "\"series\""));
    assert_non_null(strstr(page, "\"unknown_frees\":0"));
    free(page);
}

/* ---- hostile snapshots ---------------------------------------------------------
 * Pickles written opcode by opcode: what a file from someone else's machine
 * may hold. memviz refuses each with exit 1 and a message naming the file,
 * and leaves neither the page nor its temporary. */

typedef struct pkbuf {
    unsigned char *p;
    size_t n, cap;
} pkbuf;

static void pk_bytes(pkbuf *b, const void *data, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
    memcpy(b->p + b->n, data, n);
    b->n += n;
}

static void pk_op(pkbuf *b, unsigned char op) { pk_bytes(b, &op, 1); }

/* An opcode and its one-byte argument (BINGET, BINPUT, BININT1). */
static void pk_op1(pkbuf *b, unsigned char op, unsigned char arg)
{
    pk_op(b, op);
    pk_op(b, arg);
}

/* SHORT_BINUNICODE, or BINUNICODE past 255 bytes. */
static void pk_text(pkbuf *b, const char *s)
{
    size_t n = strlen(s);
    if (n < 256) {
        pk_op1(b, 0x8c, (unsigned char)n);
    } else {
        unsigned char h[5] = {'X', (unsigned char)n, (unsigned char)(n >> 8),
                              (unsigned char)(n >> 16), (unsigned char)(n >> 24)};
        pk_bytes(b, h, 5);
    }
    pk_bytes(b, s, n);
}

/* PROTO 4 and the root dict holding "device_traces": []; what follows sets
 * more keys of the root (it stays at the bottom of the stack). */
static void pk_start(pkbuf *b)
{
    pk_op1(b, 0x80, 4);
    pk_op(b, '}');
    pk_text(b, "device_traces");
    pk_op(b, ']');
    pk_op(b, 's');
}

/* STOP, and the bytes into tmp_dir/name. */
static void pk_write(pkbuf *b, const char *name)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", tmp_dir, name);
    pk_op(b, '.');
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b->p, 1, b->n, f), b->n);
    assert_int_equal(fclose(f), 0);
    free(b->p);
    memset(b, 0, sizeof *b);
}

/* A JSON text into tmp_dir/name. */
static void text_write(const char *name, const char *text)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", tmp_dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
}

/* memviz on tmp_dir/name: exit 1 with `message` and the file's name, and
 * neither the page nor its temporary left. */
static void assert_refused(const char *name, const char *message)
{
    char in[256], out[256], tmp[300], *msg;
    snprintf(in, sizeof in, "%s/%s", tmp_dir, name);
    snprintf(out, sizeof out, "%s/%s.html", tmp_dir, name);
    snprintf(tmp, sizeof tmp, "%s.tmp", out);
    int rc = memviz_run(in, out, &msg);
    if (rc != 1 || !strstr(msg, message) || !strstr(msg, name))
        fail_msg("%s: exit %d, message \"%.2000s\"; expected exit 1 and \"%s\"", name, rc, msg,
                 message);
    free(msg);
    struct stat sb;
    assert_int_not_equal(stat(out, &sb), 0);
    assert_int_not_equal(stat(tmp, &sb), 0);
}

static void test_memviz_refuses_a_container_that_holds_itself(void **state)
{
    (void)state;
    /* {"device_traces": [], "allocator_settings": <the root itself>} */
    pkbuf b = {0};
    pk_start(&b);
    pk_op(&b, 0x94); /* MEMOIZE: the root is memo 0 */
    pk_text(&b, "allocator_settings");
    pk_op1(&b, 'h', 0);
    pk_op(&b, 's');
    pk_write(&b, "self-dict.pickle");
    assert_refused("self-dict.pickle", "a container holds itself");
    /* the settings hold a list that appended itself */
    pk_start(&b);
    pk_text(&b, "allocator_settings");
    pk_op(&b, '}');
    pk_text(&b, "k");
    pk_op(&b, ']');
    pk_op(&b, 0x94);
    pk_op1(&b, 'h', 0);
    pk_op(&b, 'a');
    pk_op(&b, 's');
    pk_op(&b, 's');
    pk_write(&b, "self-list.pickle");
    assert_refused("self-list.pickle", "a container holds itself");
}

/* Nesting without a single MARK: containers pushed, then SETITEM (APPEND)
 * after SETITEM, each into the one below. */
static void test_memviz_refuses_deep_nesting_without_marks(void **state)
{
    (void)state;
    enum { LEVELS = 500000 };
    pkbuf b = {0};
    pk_start(&b);
    pk_text(&b, "allocator_settings");
    for (int k = 0; k < LEVELS; k++) {
        pk_op(&b, '}');
        pk_op1(&b, 'K', 1); /* its key, 1 */
    }
    pk_op(&b, 'N');
    for (int k = 0; k <= LEVELS; k++)
        pk_op(&b, 's');
    pk_write(&b, "deep-dicts.pickle");
    assert_refused("deep-dicts.pickle", "nested too deeply (more than 256 levels)");
    pk_start(&b);
    pk_text(&b, "allocator_settings");
    pk_op(&b, '}');
    pk_text(&b, "k");
    for (int k = 0; k < LEVELS; k++)
        pk_op(&b, ']');
    for (int k = 1; k < LEVELS; k++)
        pk_op(&b, 'a');
    pk_op(&b, 's');
    pk_op(&b, 's');
    pk_write(&b, "deep-lists.pickle");
    assert_refused("deep-lists.pickle", "nested too deeply (more than 256 levels)");
}

/* Under a kilobyte that doubles at every level through the memo: dict l
 * holds dict l-1 twice, so the settings reach 2^30 strings. */
static void test_memviz_refuses_shared_references_past_the_bound(void **state)
{
    (void)state;
    pkbuf b = {0};
    pk_start(&b);
    pk_text(&b, "allocator_settings");
    pk_op(&b, '(');
    pk_op1(&b, 'K', 0);
    pk_text(&b, "a string the page would write a billion times");
    pk_op1(&b, 'q', 0);
    for (int level = 1; level <= 30; level++) {
        pk_op1(&b, 'K', (unsigned char)level); /* the settings' key */
        pk_op(&b, '}');
        pk_text(&b, "a");
        pk_op1(&b, 'h', (unsigned char)(level - 1));
        pk_op(&b, 's');
        pk_text(&b, "b");
        pk_op1(&b, 'h', (unsigned char)(level - 1));
        pk_op(&b, 's');
        pk_op1(&b, 'q', (unsigned char)level);
    }
    pk_op(&b, 'd'); /* {0: the string, 1: dict 1, ..., 30: dict 30} */
    pk_op(&b, 's');
    assert_true(b.n < 1024);
    pk_write(&b, "doubling.pickle");
    assert_refused("doubling.pickle", "through shared references");

    /* one segment listed 20,000 times, its blocks one block 1,000 times */
    pk_start(&b);
    pk_text(&b, "segments");
    pk_op(&b, ']');
    pk_op(&b, '(');
    pk_op(&b, '}');
    pk_text(&b, "device");
    pk_text(&b, "cuda:0");
    pk_op(&b, 's');
    pk_text(&b, "address");
    pk_op1(&b, 'K', 0);
    pk_op(&b, 's');
    pk_text(&b, "total_size");
    pk_op1(&b, 'K', 0);
    pk_op(&b, 's');
    pk_text(&b, "blocks");
    pk_op(&b, ']');
    pk_op(&b, '(');
    pk_op(&b, '}');
    pk_text(&b, "size");
    pk_op1(&b, 'K', 0);
    pk_op(&b, 's');
    pk_text(&b, "state");
    pk_text(&b, "inactive");
    pk_op(&b, 's');
    pk_op1(&b, 'q', 0);
    for (int k = 1; k < 1000; k++)
        pk_op1(&b, 'h', 0);
    pk_op(&b, 'e');
    pk_op(&b, 's');
    pk_op1(&b, 'q', 1);
    for (int k = 1; k < 20000; k++)
        pk_op1(&b, 'h', 1);
    pk_op(&b, 'e');
    pk_op(&b, 's');
    assert_true(b.n < 1 << 20);
    pk_write(&b, "shared-segments.pickle");
    assert_refused("shared-segments.pickle", "through shared references");
}

/* A 60 KB string the settings list 2,000 times: a 120 MB page from a
 * 64 KB file is past the bound on the page's size, found while it is being
 * written: the temporary goes too. */
static void test_memviz_refuses_a_page_past_the_bound(void **state)
{
    (void)state;
    enum { LEN = 60000, TIMES = 2000 };
    char *big = malloc(LEN + 1);
    assert_non_null(big);
    memset(big, 'x', LEN);
    big[LEN] = '\0';
    pkbuf b = {0};
    pk_start(&b);
    pk_text(&b, "allocator_settings");
    pk_op(&b, '}');
    pk_text(&b, "a");
    pk_op(&b, ']');
    pk_op(&b, '(');
    pk_text(&b, big);
    pk_op1(&b, 'q', 0);
    for (int k = 1; k < TIMES; k++)
        pk_op1(&b, 'h', 0);
    pk_op(&b, 'e');
    pk_op(&b, 's');
    pk_op(&b, 's');
    free(big);
    pk_write(&b, "big-page.pickle");
    assert_refused("big-page.pickle", "the page would be larger than");
}

/* memviz on tmp_dir/name in a child whose peak memory (KiB) comes back. */
static int memviz_run_measured(const char *name, long *max_rss_kib)
{
    char in[256], out[256], log[256];
    snprintf(in, sizeof in, "%s/%s", tmp_dir, name);
    snprintf(out, sizeof out, "%s/%s.html", tmp_dir, name);
    snprintf(log, sizeof log, "%s/%s.log", tmp_dir, name);
    fflush(stdout);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd < 0)
            _exit(126);
        dup2(fd, 1);
        dup2(fd, 2);
        execl(memviz, memviz, in, out, (char *)NULL);
        _exit(127);
    }
    int status = 0;
    struct rusage ru;
    assert_int_equal(wait4(pid, &status, 0, &ru), pid);
    *max_rss_kib = ru.ru_maxrss;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        char *msg = read_all(log);
        fail_msg("%s: status %d: %.2000s", name, status, msg);
    }
    return 0;
}

/* 16,000 APPENDs to one list, and as many SETITEMs to one dict: growing a
 * container by one must not copy it whole (that is 1 GB and 2 GB). */
static void test_memviz_grows_containers_in_linear_memory(void **state)
{
    (void)state;
    enum { N = 16000 };
    pkbuf b = {0};
    pk_start(&b);
    pk_text(&b, "allocator_settings");
    pk_op(&b, '}');
    pk_text(&b, "list");
    pk_op(&b, ']');
    for (int k = 0; k < N; k++) {
        pk_op(&b, 'N');
        pk_op(&b, 'a');
    }
    pk_op(&b, 's');
    pk_op(&b, 's');
    pk_write(&b, "appends.pickle");
    long rss;
    memviz_run_measured("appends.pickle", &rss);
    if (rss > 300 * 1024)
        fail_msg("%d APPENDs took %ld KiB", N, rss);
    pk_start(&b);
    pk_text(&b, "allocator_settings");
    pk_op(&b, '}');
    for (int k = 0; k < N; k++) {
        pk_op1(&b, 'K', (unsigned char)k);
        pk_op(&b, 'N');
        pk_op(&b, 's');
    }
    pk_op(&b, 's');
    pk_write(&b, "setitems.pickle");
    memviz_run_measured("setitems.pickle", &rss);
    if (rss > 300 * 1024)
        fail_msg("%d SETITEMs took %ld KiB", N, rss);
    char path[256];
    snprintf(path, sizeof path, "%s/setitems.pickle.html", tmp_dir);
    char *page = read_all(path);
    assert_non_null(strstr(page, "\"settings\":{\"0\":null,\"1\":null,"));
    free(page);
}

/* Addresses and sizes near 2^63: their sums are refused, not wrapped. */
static void test_memviz_refuses_address_arithmetic_that_overflows(void **state)
{
    (void)state;
    text_write("overflow-block.json",
               "{\"devices\": [\"cpu\"], \"device_traces\": [[]], \"segments\": [\n"
               " {\"device\": \"cpu\", \"address\": 9223372036854775000, \"total_size\": 4096,\n"
               "  \"blocks\": [{\"size\": 4096, \"state\": \"inactive\"}]}]}\n");
    assert_refused("overflow-block.json",
                   "segments[0].blocks[0]: address + size overflows 64 bits");
    text_write("overflow-segment.json",
               "{\"devices\": [\"cpu\"], \"device_traces\": [[]], \"segments\": [\n"
               " {\"device\": \"cpu\", \"address\": 9223372036854775000, \"total_size\": 4096,\n"
               "  \"blocks\": []}]}\n");
    assert_refused("overflow-segment.json", "segments[0]: address + total_size overflows 64 bits");
    text_write("overflow-total.json",
               "{\"devices\": [\"cpu\"], \"segments\": [], \"device_traces\": [[\n"
               " {\"action\": \"alloc\", \"addr\": 64, \"size\": 9223372036854775807,\n"
               "  \"manager\": \"system/a\"},\n"
               " {\"action\": \"alloc\", \"addr\": 128, \"size\": 9223372036854775807,\n"
               "  \"manager\": \"system/b\"}]]}\n");
    assert_refused("overflow-total.json", "byte count in use overflows 64 bits");
    text_write("overflow-reserved.json",
               "{\"devices\": [\"cpu\"], \"segments\": [], \"device_traces\": [[\n"
               " {\"action\": \"segment_alloc\", \"addr\": 64, \"size\": 9223372036854775807},\n"
               " {\"action\": \"segment_alloc\", \"addr\": 128, \"size\": 9223372036854775807}]]}\n");
    assert_refused("overflow-reserved.json", "reserved byte count overflows 64 bits");
}

/* TUPLE2 right above a MARK takes what is below it: the APPENDS that
 * follows must not find a mark above the stack; nor may one that finds
 * no stack at all. */
static void test_memviz_refuses_a_tuple_across_a_mark(void **state)
{
    (void)state;
    pkbuf b = {0};
    pk_op1(&b, 0x80, 4);
    pk_op(&b, ']');
    pk_op(&b, ']');
    pk_op(&b, '(');
    pk_op(&b, 0x86);
    pk_op(&b, 'e');
    pk_write(&b, "tuple-mark.pickle");
    assert_refused("tuple-mark.pickle", "stack underflow");
    /* APPENDS at the very start: a mark over an empty stack */
    pk_op1(&b, 0x80, 4);
    pk_op(&b, '(');
    pk_op(&b, 'e');
    pk_write(&b, "empty-mark.pickle");
    assert_refused("empty-mark.pickle", "nothing below the mark");
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: %s ndm-memviz fixture-dir chromium-or-empty python3\n", argv[0]);
        return 2;
    }
    memviz = argv[1];
    data_dir = argv[2];
    chromium = argv[3];
    python = argv[4];
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/ndm-memviz-XXXXXX");
    if (!mkdtemp(tmp_dir)) {
        perror("mkdtemp");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        TEST(test_memviz_page_renders_every_manager_in_chromium),
        TEST(test_memviz_totals_follow_allocs_and_frees),
        TEST(test_memviz_page_fetches_nothing),
        TEST(test_memviz_hostile_names_stay_text),
        TEST(test_memviz_rejects_malformed_snapshots),
        TEST(test_memviz_usage_is_exit_2),
        TEST(test_memviz_never_writes_over_a_snapshot),
        TEST(test_memviz_real_snapshot_from_the_allocator),
        TEST(test_memviz_replay_rewinds_the_segment_map),
        TEST(test_memviz_hover_names_one_allocation),
        TEST(test_memviz_zoom_and_segments_to_scale),
        TEST(test_memviz_reads_pytorch_pickles),
        TEST(test_memviz_compares_two_snapshots),
        TEST(test_memviz_draws_blocks_from_before_the_window),
        TEST(test_memviz_refuses_a_container_that_holds_itself),
        TEST(test_memviz_refuses_deep_nesting_without_marks),
        TEST(test_memviz_refuses_shared_references_past_the_bound),
        TEST(test_memviz_refuses_a_page_past_the_bound),
        TEST(test_memviz_grows_containers_in_linear_memory),
        TEST(test_memviz_refuses_address_arithmetic_that_overflows),
        TEST(test_memviz_refuses_a_tuple_across_a_mark),
    };
    int rc = cmocka_run_group_tests_name("memviz", tests, NULL, NULL);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmp_dir);
    return rc;
}
