// The facts `strata inspect` reports about a GGUF file, as one JSON document: --json prints it, the text view is
// rendered from it, so the two always agree. Long values are summarised (count and first elements), never dumped.
#pragma once

#include <nlohmann/json.hpp>

namespace strata {

class GgufFile;

nlohmann::ordered_json inspect_facts(const GgufFile &f);

}  // namespace strata
