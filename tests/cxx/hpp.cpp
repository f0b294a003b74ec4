/* ndm.hpp, run: owners release and close on destruction (an exception
 * unwinding through a scope included), operators compute what the C calls
 * do, failures throw ndm::error naming the line of this file (or, with
 * exceptions off, leave empty owners and the C status), and nothing is left
 * in any manager at the end. Built by hpp.sh with g++ and clang++, with and
 * without exceptions, under AddressSanitizer and UBSan. */
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <ndm/ndm.hpp>

#include "expect.h"

static const ndm_device cpu = {NDM_DEVICE_CPU, 0};

static ndm_stats stats_of(ndm_manager m)
{
    ndm_stats st{};
    if (ndm_manager_stats(m, cpu, NDM_STATS_SUBTREE, &st) != NDM_OK)
        st.live_arrays = st.children = ~0ull;
    return st;
}

static bool same(const std::vector<float> &a, const std::vector<float> &b)
{
    return a == b;
}

/* What ndm_report_since(m, mark) prints, as text. */
static std::string report(ndm_manager m, ndm_seq mark)
{
    char *buf = nullptr;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    if (!f)
        return "";
    (void)ndm_report_since(m, mark, f);
    std::fclose(f);
    std::string s(buf ? buf : "");
    std::free(buf);
    return s;
}

static std::string here(int line)
{
    return std::string("hpp.cpp:") + std::to_string(line);
}

static void owners()
{
    ndm_manager raw{0};
    {
        ndm::manager m(ndm_system(), "owners");
        raw = m;
        EXPECT(bool(m) && ndm_manager_valid(raw));
        {
            ndm::array a = ndm::ones(m, NDM_F32, {2, 3});
            EXPECT(a.ok() && a.size() == 6 && a.ndim() == 2 && a.dim(1) == 3);
            EXPECT((a.shape() == std::vector<int64_t>{2, 3}));
            EXPECT(stats_of(m).live_arrays == 1);
        }
        EXPECT(stats_of(m).live_arrays == 0); /* released by the owner */

        /* moves leave the source empty; release() hands the handle over */
        ndm::array b = ndm::zeros(m, NDM_F32, {4});
        ndm::array c = std::move(b);
        EXPECT(b.get().id == 0 && !b.ok() && c.ok());
        ndm_array h = c.release();
        EXPECT(c.get().id == 0 && ndm_array_valid(h));
        EXPECT(ndm_array_release(h) == NDM_OK);
        EXPECT(stats_of(m).live_arrays == 0);

        /* an owner made from a C result */
        ndm::array d = ndm::adopt(ndm_ones(m, NDM_F32, NDM_SHAPE(3)));
        ndm::array e = ndm::adopt(ndm_relu(d));
        EXPECT(e.ok() && e.owner().id == m.get().id);
        (void)e.release(); /* left to the manager's close */
    }
    EXPECT(!ndm_manager_valid(raw)); /* closed by its owner, with the array left in it */

    /* an array owner that outlives its manager finds its handle stale */
    ndm::array late;
    {
        ndm::manager m(ndm_system(), "short");
        late = ndm::ones(m, NDM_F32, {8});
        EXPECT(late.ok());
    }
    EXPECT(!late.ok());
    late.reset(); /* nothing to do, and nothing read */

    /* close(): once, then NDM_ALREADY */
    ndm::manager m(ndm_system(), "closing");
    EXPECT(m.close() == NDM_OK);
    EXPECT(m.close() == NDM_ALREADY);
}

static void operators()
{
    ndm::manager m(ndm_system(), "ops");
    ndm::array a = ndm::from(m, std::vector<float>{1, 2, 3, 4}, {2, 2});
    EXPECT(a.dtype() == NDM_F32 && a.dim(0) == 2);
    EXPECT(same((a * 2.0 + 1.0).to_vector<float>(), {3, 5, 7, 9}));
    EXPECT(same((10.0 - a).to_vector<float>(), {9, 8, 7, 6}));
    EXPECT(same((12.0 / a).to_vector<float>(), {12, 6, 4, 3}));
    EXPECT(same((2.0 * a - a).to_vector<float>(), {1, 2, 3, 4}));
    EXPECT(same((a / a).to_vector<float>(), {1, 1, 1, 1}));
    EXPECT(same((-a).to_vector<float>(), {-1, -2, -3, -4}));
    EXPECT(same((a + a * a).to_vector<float>(), {2, 6, 12, 20}));
    EXPECT((a > 2.0).to_vector<uint8_t>() == (std::vector<uint8_t>{0, 0, 1, 1}));
    EXPECT((2.0 < a).to_vector<uint8_t>() == (std::vector<uint8_t>{0, 0, 1, 1}));
    EXPECT((a == a).to_vector<uint8_t>() == (std::vector<uint8_t>{1, 1, 1, 1}));
    EXPECT((a != 3.0).to_vector<uint8_t>() == (std::vector<uint8_t>{1, 1, 0, 1}));
    EXPECT((a <= a - 1.0).to_vector<uint8_t>() == (std::vector<uint8_t>{0, 0, 0, 0}));

    ndm::array eye = ndm::from(m, std::vector<float>{0, 1, 1, 0}, {2, 2});
    EXPECT(same(ndm::matmul(a, eye).to_vector<float>(), {2, 1, 4, 3}));
    EXPECT(same(a.matmul(eye).to_vector<float>(), {2, 1, 4, 3}));
    EXPECT(same(a.t().to_vector<float>(), {1, 3, 2, 4}));
    EXPECT(ndm::sum(a).item() == 10.0);
    EXPECT(same(ndm::mean(a, {0}).to_vector<float>(), {2, 3}));
    EXPECT(same(ndm::sum(a, {1}, true).to_vector<float>(), {3, 7}));
    EXPECT(ndm::sum(a, {1}, true).ndim() == 2);
    EXPECT(same(ndm::relu(a - 2.5).to_vector<float>(), {0, 0, 0.5f, 1.5f}));
    EXPECT(std::fabs(ndm::exp(ndm::log(a)).to_vector<float>()[3] - 4.0f) < 1e-5f);

    /* views: slice, select, reshape */
    ndm::array v = ndm::arange(m, NDM_F32, 0, 10);
    EXPECT(same(v.slice(0, 2, 5).to_vector<float>(), {2, 3, 4}));
    EXPECT(same(v.slice(0, 7).to_vector<float>(), {7, 8, 9}));
    EXPECT(same(v.slice(0, 0, NDM_END, 4).to_vector<float>(), {0, 4, 8}));
    EXPECT(same(v.reshape({2, 5}).select(0, 1).to_vector<float>(), {5, 6, 7, 8, 9}));

    /* in place */
    ndm::array w = ndm::ones(m, NDM_F32, {2, 2});
    w += a;
    w *= 2.0;
    w -= 1;
    EXPECT(same(w.to_vector<float>(), {3, 5, 7, 9}));
    w /= a + 2.0;
    EXPECT(same(w.to_vector<float>(), {1, 1.25f, 1.4f, 1.5f}));

    /* printing is ndm_array_format's text */
    std::ostringstream os;
    os << ndm::from(m, std::vector<float>{1, 2}, {2});
    EXPECT(os.str() == "array([1., 2.], dtype=float32)");
    std::ostringstream bad;
    bad << ndm::array();
    EXPECT(bad.str().find("<invalid array: ") == 0);

    EXPECT(stats_of(m).live_arrays == 4); /* a, eye, v, w: no temporary is left */
}

/* Creations name this file's lines, in leak reports as in messages. */
static void sites()
{
    ndm::manager m(ndm_system(), "sites");
    ndm_seq mark = ndm_mark(m);
    int line = __LINE__; ndm::array a = ndm::ones(m, NDM_F32, {3});
    int line2 = __LINE__; ndm::array b = a * 2.0;
    std::string d = report(m, mark);
    EXPECT(d.find(here(line)) != std::string::npos);
    EXPECT(d.find(here(line2)) != std::string::npos);
    EXPECT(d.find("ndm.hpp") == std::string::npos);

    ndm::array c = ndm::ones(m, NDM_F32, {4});
#if NDM_HPP_THROWS
    bool caught = false;
    int bad = 0;
    try {
        bad = __LINE__; ndm::array x = a + c;
        EXPECT(false); /* not reached */
    } catch (const ndm::error &e) {
        caught = true;
        EXPECT(e.status() == NDM_E_SHAPE);
        EXPECT(std::string(e.what()).find(here(bad)) != std::string::npos);
        EXPECT(std::string(e.what()).find("ndm.hpp") == std::string::npos);
    }
    EXPECT(caught);
    caught = false;
    ndm_clear_error(); /* (else the null handle reads as the failure before) */
    try {
        (void)ndm::adopt(ndm_relu(ndm_array{0}));
    } catch (const ndm::error &e) {
        caught = e.status() == NDM_E_NULL;
    }
    EXPECT(caught);
    caught = false;
    try {
        bad = __LINE__; (void)a.item(); /* three elements */
    } catch (const ndm::error &e) {
        caught = e.status() == NDM_E_SHAPE;
        /* the C call the owner makes, at the caller's line */
        EXPECT(std::string(e.what()).rfind("ndm_item: ", 0) == 0);
        EXPECT(std::string(e.what()).find(here(bad)) != std::string::npos);
    }
    EXPECT(caught);
    caught = false;
    try {
        bad = __LINE__; (void)a.to_vector<double>(); /* 8-byte elements of a f32 array */
    } catch (const ndm::error &e) {
        caught = e.status() == NDM_E_INVALID;
        EXPECT(std::string(e.what()).rfind("ndm_array_copy_out: ", 0) == 0);
        EXPECT(std::string(e.what()).find(here(bad)) != std::string::npos);
    }
    EXPECT(caught);
#else
    int bad = __LINE__; ndm::array x = a + c;
    EXPECT(!x.ok() && x.get().id == 0);
    EXPECT(ndm_last_status() == NDM_E_SHAPE);
    EXPECT(std::string(ndm_last_error()).find(here(bad)) != std::string::npos);
    bad = __LINE__; EXPECT(std::isnan(a.item()));
    EXPECT(std::string(ndm_last_error()).rfind("ndm_item: ", 0) == 0);
    EXPECT(std::string(ndm_last_error()).find(here(bad)) != std::string::npos);
#endif
    EXPECT(stats_of(m).live_arrays == 3);
}

#if NDM_HPP_THROWS
/* What a scope holds goes when an exception unwinds through it. */
static void unwinding()
{
    ndm::manager m(ndm_system(), "unwind");
    bool caught = false;
    try {
        ndm::scope s(m, "step");
        ndm::array t = ndm::ones(s, NDM_F32, {16});
        ndm::array u = t * 3.0;                    /* in the scope (its first input's) */
        ndm_array loose = ndm_add(u.get(), u.get()); /* no owner: the scope holds it */
        EXPECT(loose.id != 0);
        EXPECT(stats_of(m).live_arrays == 3 && stats_of(m).children == 1);
        throw std::runtime_error("boom");
    } catch (const std::runtime_error &) {
        caught = true;
    }
    EXPECT(caught);
    EXPECT(stats_of(m).live_arrays == 0 && stats_of(m).children == 0);

    /* an ndm failure thrown inside a scope: the same */
    caught = false;
    try {
        ndm::scope s(m, "step");
        ndm::array t = ndm::ones(s, NDM_F32, {2});
        ndm::array u = ndm::ones(s, NDM_F32, {3});
        ndm::array w = t + u; /* shapes do not broadcast */
    } catch (const ndm::error &e) {
        caught = e.status() == NDM_E_SHAPE;
    }
    EXPECT(caught);
    EXPECT(stats_of(m).live_arrays == 0 && stats_of(m).children == 0);

    /* kept: moved to the scope's parent, the rest released */
    ndm::array kept;
    {
        ndm::scope s(m, "step");
        ndm::array t = ndm::ones(s, NDM_F32, {2});
        kept = s.keep(t * 5.0);
    }
    EXPECT(kept.ok() && kept.owner().id == m.get().id);
    EXPECT(same(kept.to_vector<float>(), {5, 5}));
    EXPECT(stats_of(m).live_arrays == 1 && stats_of(m).children == 0);
}
#endif

/* Modules from lambdas: a residual block x + fc2(relu(fc1(x))) inside a
 * net with a mask input, equal to the same computation written out, with
 * PyTorch's names; a failure inside a lambda reaches the caller as
 * ndm::error naming the lambda's line, and a C++ exception of another kind
 * comes out as itself. */
static int lambda_line;

static void modules()
{
    ndm::manager m(ndm_system(), "modules");
    ndm::manager model(m, "model");
    ndm_rng rng = ndm_rng_new(1);
    ndm::module block = ndm::make_module(model, "Block",
        [](const ndm::module &self, const std::vector<ndm::array> &in) {
            ndm::array h = ndm::relu(self.child("fc1")(in[0]));
            return in[0] + self.child("fc2")(h);
        });
    block.register_child("fc1", ndm_linear(model, 3, 6, true, &rng));
    block.register_child("fc2", ndm_linear(model, 6, 3, true, &rng));
    ndm::module net = ndm::make_module(model, "Net",
        [](const ndm::module &self, const std::vector<ndm::array> &in) {
            ndm::array y = self.child("blocks.0")(in[0]) * self.param("scale");
            return in.size() > 1 && in[1].ok() ? y * in[1] : std::move(y);
        });
    net.register_parameter("scale", ndm::full(model, NDM_F32, 2.0, {3}));
    net.register_child("blocks", ndm_module_list(model, NDM_MODULES(block)));
    EXPECT(net.ok() && block.ok() && !ndm::module().ok());
    EXPECT(net.describe() == "Net(blocks=ModuleList(Block(fc1=Linear(3, 6), fc2=Linear(6, 3))))");
    EXPECT(net.child("blocks.0.fc2").name() == "blocks.0.fc2");
    const char *names[8];
    EXPECT(ndm_module_named_parameters(net, names, nullptr, 8) == 5);
    EXPECT(std::string(names[0]) == "scale" && std::string(names[4]) == "blocks.0.fc2.bias");
    {
        ndm::manager batch(m, "batch");
        ndm::array x = ndm::from<float>(batch, {1, -2, 3, 0.5f, 0, -1}, {2, 3});
        ndm::array mask = ndm::full(batch, NDM_F32, 3.0, {2, 3});
        ndm::array y = net(x);
        ndm::array ym = net({x, mask});
        ndm::array none;
        ndm::array yn = net({x, none});
        /* the same computation with raw operations */
        auto lin = [&](const char *w, const char *b, const ndm::array &v) {
            return ndm::matmul(v, net.param(w).t()) + net.param(b);
        };
        ndm::array h = ndm::relu(lin("blocks.0.fc1.weight", "blocks.0.fc1.bias", x));
        ndm::array want = (x + lin("blocks.0.fc2.weight", "blocks.0.fc2.bias", h)) * 2.0;
        EXPECT(y.ok() && same(y.to_vector<float>(), want.to_vector<float>()));
        ndm::array want3 = want * 3.0;
        EXPECT(ym.ok() && same(ym.to_vector<float>(), want3.to_vector<float>()));
        EXPECT(yn.ok() && same(yn.to_vector<float>(), want.to_vector<float>()));
        EXPECT(stats_of(batch).children == 0);
    }
    {
        /* weight tying: one array under two names, listed once as a parameter */
        ndm::module lm = ndm::make_module(model, "LM",
            [](const ndm::module &self, const std::vector<ndm::array> &in) {
                return self.child("head")(self.child("emb")(in[0]));
            });
        lm.register_child("emb", ndm_embedding(model, 5, 3, &rng));
        lm.register_child("head", ndm_linear(model, 3, 5, false, &rng));
        lm.tie("head.weight", "emb.weight");
        ndm_array w = ndm_module_get_array(lm, "emb.weight");
        EXPECT(ndm_module_get_array(lm, "head.weight").id == w.id);
        EXPECT(ndm_module_parameters(lm, nullptr, 0) == 1 &&
               ndm_module_named_state(lm, nullptr, nullptr, 0) == 2);
        EXPECT(lm.describe() == "LM(emb=Embedding(5, 3), head=Linear(3, 5, bias=false)) "
                                "[head.weight (tied to emb.weight)]");
        ndm::manager batch(m, "batch");
        int64_t idx[2] = {4, 1};
        ndm::array y = lm(ndm::array(ndm_from_buffer(batch, NDM_I64, idx, NDM_SHAPE(2))));
        ndm::array e = ndm::array(
            ndm_take_to(batch, w, 0, ndm_from_buffer(batch, NDM_I64, idx, NDM_SHAPE(2))));
        ndm::array want = ndm::matmul(e, lm.param("emb.weight").t());
        EXPECT(y.ok() && same(y.to_vector<float>(), want.to_vector<float>()));
#if NDM_HPP_THROWS
        bool caught = false;
        try {
            lm.tie("head.weight", "nothing");
        } catch (const ndm::error &err) {
            caught = err.status() == NDM_E_INVALID;
        }
        EXPECT(caught);
#endif
        ndm_clear_error();
    }
    ndm::module bad = ndm::make_module(model, "Bad",
        [](const ndm::module &, const std::vector<ndm::array> &in) {
            ndm::array wrong = ndm::ones(NDM_CURRENT_SCOPE, NDM_F32, {7});
            lambda_line = __LINE__; return in[0] + wrong;
        });
#if NDM_HPP_THROWS
    ndm::module odd = ndm::make_module(model, "Odd",
        [](const ndm::module &, const std::vector<ndm::array> &) -> ndm::array {
            throw std::runtime_error("not an ndm error");
        });
    {
        ndm::manager batch(m, "batch");
        ndm::array x = ndm::ones(batch, NDM_F32, {2, 3});
        bool caught = false;
        try {
            ndm::array y = bad(x);
        } catch (const ndm::error &e) {
            caught = e.status() == NDM_E_SHAPE &&
                     std::string(e.what()).find(here(lambda_line)) != std::string::npos;
        }
        EXPECT(caught);
        caught = false;
        try {
            ndm::array y = odd(x);
        } catch (const std::runtime_error &e) {
            caught = std::string(e.what()) == "not an ndm error";
        }
        EXPECT(caught);
        EXPECT(stats_of(batch).live_arrays == 1);
        /* a refused registration throws */
        caught = false;
        try {
            net.register_child("x.y", ndm_relu_module(model));
        } catch (const ndm::error &e) {
            caught = e.status() == NDM_E_INVALID;
        }
        EXPECT(caught);
    }
#else
    {
        ndm::manager batch(m, "batch");
        ndm::array x = ndm::ones(batch, NDM_F32, {2, 3});
        ndm::array y = bad(x);
        EXPECT(!y.ok() && ndm_last_status() == NDM_E_SHAPE);
        EXPECT(std::string(ndm_last_error()).find(here(lambda_line)) != std::string::npos);
        EXPECT(stats_of(batch).live_arrays == 1);
    }
#endif
    (void)model.close();
    EXPECT(!net.ok() && !bad.ok());
}

int main()
{
    ndm_stats start = stats_of(ndm_system()); /* (its built-in children) */
    owners();
    operators();
    sites();
    modules();
#if NDM_HPP_THROWS
    unwinding();
    std::printf("exceptions: ");
#else
    std::printf("no exceptions: ");
#endif
    ndm_stats all = stats_of(ndm_system());
    EXPECT(all.live_arrays == 0 && all.children == start.children);
    std::printf("%s\n", failures ? "FAILED" : "ok");
    return failures != 0;
}
