// The passes of one engine call run through the parts of a split model as a pipeline: part p works on pass j while
// part p + 1 works on pass j - 1 (Engine::run_passes, for calls of several passes whose tokens are all known: a
// prompt's chunks).
//
// Protocol (one thread per part: part 0 on the caller's, the others started here; `done[p]` counts the passes part p
// has finished; one mutex and condition variable guard them):
//   1. Part p starts pass j when part p - 1 has finished it (done[p - 1] > j: its residual stream for pass j is
//      written) and, for p before the last, when part p + 1 has finished pass j - 2 (done[p + 1] >= j - 1): part p
//      writes pass j's residual into buffer j % 2 of its boundary, which part p + 1 read for pass j - 2.
//   2. run(p, j) runs part p's pass j outside the lock; then done[p] = j + 1 and everyone is woken. The last part
//      calls finished(j) after its pass j, in pass order, on its own thread.
//   3. An exception in any part is kept (the first one), every part stops before its next pass, the threads are
//      joined and it is rethrown on the caller's thread. done_passes() then says how many passes the last part
//      finished: those are complete in every part.
// A part's passes run in pass order on one thread, so each part's state (caches, expert cache, scratch) sees the
// same sequence of passes as without the pipeline: the results are the same bits.
// Micro-passes (STRATA_SPLIT_MICROBATCH=1, where the pipeline is and every part is on the host): a call of one pass
// holding several sequences (a decoding step of parallel requests, prompts admitted together) is cut between its
// sequences into as many passes as there are parts, so part 0 works on the second while part 1 works on the first.
// Each sequence's tokens stay in one pass, at the same positions, and every host op works per token or per
// sequence, so the cut changes no bit. A GPU's kernels take their form from the pass's row count, so GPU parts
// never cut.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace strata {

struct PartPipeline {
    std::function<void(size_t part)> bind;               // once on each part's thread before its first pass
    std::function<void(size_t part, size_t pass)> run;   // part's share of a pass
    std::function<void(size_t pass)> finished;           // after the last part's share of a pass
};

// Runs n_passes passes through n_parts parts as above; returns the passes the last part finished (n_passes unless
// it threw).
size_t run_part_pipeline(size_t n_parts, size_t n_passes, const PartPipeline &p, size_t *done_passes = nullptr);

// Where a pass of segments (their token counts, in row order) is cut into min(segments, n) micro-passes of whole
// segments, the largest micro-pass as small as it can be: the index of each micro-pass's first segment (from 0).
std::vector<size_t> micro_pass_starts(const std::vector<int64_t> &seg_tokens, size_t n);

}  // namespace strata
