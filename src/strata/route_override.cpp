// Benchmark routing's names and draws (route_override.h).
#include "strata/route_override.h"

#include <cstdio>
#include <cstdlib>

#include "core/error.h"

namespace strata {

RouteOverride parse_route_override(const std::string &s) {
    RouteOverride o;
    if (s == "model") return o;
    if (s == "uniform") {
        o.kind = RouteOverride::Uniform;
        return o;
    }
    if (s.rfind("zipf:", 0) == 0) {
        const std::string v = s.substr(5);
        char *end = nullptr;
        const double x = v.empty() ? 0.0 : std::strtod(v.c_str(), &end);
        if (!v.empty() && end && *end == '\0' && x > 0.0 && x <= 10.0) {
            o.kind = RouteOverride::Zipf;
            o.skew = x;
            return o;
        }
    }
    fail("--routing: '%s' is not a routing (expected model, uniform or zipf:S with 0 < S <= 10, e.g. zipf:1.2)",
         s.c_str());
}

std::string route_override_name(const RouteOverride &o) {
    switch (o.kind) {
        case RouteOverride::Model:
            return "model";
        case RouteOverride::Uniform:
            return "uniform";
        case RouteOverride::Zipf: {
            char b[32];
            std::snprintf(b, sizeof b, "zipf:%g", o.skew);
            return b;
        }
    }
    return "model";
}

RouteDraws draws_of(const RouteOverride &o) {
    STRATA_ASSERT(o.active());
    RouteDraws d;
    d.kind = o.kind == RouteOverride::Zipf ? RouteDraws::Zipf : RouteDraws::Uniform;
    d.skew = o.skew;
    d.seed = o.seed;
    return d;
}

void draw_experts(const RouteOverride &o, int64_t il, int64_t pass, int64_t row, int64_t n_expert, int64_t k,
                  int32_t *ids) {
    draw_experts(draws_of(o), il, pass, row, n_expert, k, ids);
}

}  // namespace strata
