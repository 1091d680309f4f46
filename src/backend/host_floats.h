// Floats in host memory that a backend copies to or from its device in bulk (a split model's residual stream
// between parts, model/forward.h): the backend's page-locked memory where it has some (Backend::alloc_host), else
// ordinary memory. The backend that allocated them must outlive them.
#pragma once

#include <cstddef>
#include <utility>

#include "backend/backend.h"

namespace strata {

class HostFloats {
  public:
    HostFloats() = default;
    HostFloats(const HostFloats &) = delete;
    HostFloats &operator=(const HostFloats &) = delete;
    HostFloats(HostFloats &&o) noexcept { take(o); }
    HostFloats &operator=(HostFloats &&o) noexcept {
        if (this != &o) {
            release();
            take(o);
        }
        return *this;
    }
    ~HostFloats() { release(); }

    // n floats from be's memory (what they held is not kept where they grow).
    void resize(size_t n, Backend &be) {
        if (n > cap_ || (owner_ && owner_ != &be)) {
            release();
            p_ = be.alloc_host(n);
            owner_ = p_ ? &be : nullptr;
            if (!p_) p_ = new float[n];
            cap_ = n;
        }
        n_ = n;
    }
    float *data() { return p_; }
    const float *data() const { return p_; }
    size_t size() const { return n_; }
    bool page_locked() const { return owner_ != nullptr; }

  private:
    void release() {
        if (owner_)
            owner_->free_host(p_);
        else
            delete[] p_;
        owner_ = nullptr, p_ = nullptr, n_ = 0, cap_ = 0;
    }
    void take(HostFloats &o) {
        owner_ = std::exchange(o.owner_, nullptr);
        p_ = std::exchange(o.p_, nullptr);
        n_ = std::exchange(o.n_, 0);
        cap_ = std::exchange(o.cap_, 0);
    }
    Backend *owner_ = nullptr;  // where p_ is the backend's memory, else new[]'s
    float *p_ = nullptr;
    size_t n_ = 0, cap_ = 0;
};

}  // namespace strata
