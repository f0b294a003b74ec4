// A service in C++ with ndm.hpp: the model's weights live in one manager,
// each request gets its own, and a bad request throws without leaving
// anything behind. Build: c++ -std=c++17 cxx_service.cpp $(pkg-config --cflags --libs ndm)
#include <cstdio>
#include <iostream>
#include <vector>

#include <ndm/ndm.hpp>

// One layer, y = relu(x W + b), over a request's input.
static ndm::array predict(const ndm::array &w, const ndm::array &b, const ndm::array &x)
{
    return ndm::relu(ndm::matmul(x, w) + b);
}

int main()
{
    ndm::manager model(ndm_system(), "model");
    ndm::array w = ndm::from(model, std::vector<float>{1, -1, 0.5f, 2, 0, 1}, {3, 2});
    ndm::array b = ndm::from(model, std::vector<float>{0.5f, -1}, {2});

    const std::vector<std::vector<float>> requests = {{1, 2, 3}, {0, 0, 1}, {4, 5}};
    for (size_t i = 0; i < requests.size(); i++) {
        ndm::manager request(model, "request"); // closed at the end of the iteration
        try {
            ndm::array x = ndm::from(request, requests[i], {1, (int64_t)requests[i].size()});
            ndm::array y = predict(w, b, x); // in the request's manager (its first input's)
            std::cout << "request " << i << ": " << y << "\n";
        } catch (const ndm::error &e) {
            std::cout << "request " << i << ": refused (" << ndm_status_name(e.status())
                      << ")\n";
        }
    }

    ndm::manager step(model, "step");
    {
        ndm::scope s(step, "temporaries"); // catches the results of operations below
        ndm::array h = w * 2.0 - 1.0;
        std::cout << "sum of 2w - 1: " << ndm::sum(h).item() << "\n";
    }
    ndm_stats st = model.stats(NDM_STATS_SUBTREE);
    std::cout << "model holds " << st.live_arrays << " arrays, " << st.children
              << " child manager\n";
    return 0;
}
