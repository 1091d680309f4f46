// The chat page served at GET /: one self-contained HTML document (inline CSS and JavaScript, no external assets).
#pragma once

#include <string>

namespace strata::server {

const std::string &web_page();

}  // namespace strata::server
