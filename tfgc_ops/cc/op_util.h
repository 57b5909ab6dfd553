// Helpers shared by the op files: a shape function and block-parallel loops.
#ifndef TFGC_OPS_CC_OP_UTIL_H_
#define TFGC_OPS_CC_OP_UTIL_H_

#include <functional>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/util/work_sharder.h"

namespace tensorflow {
namespace tfgc_ops {

// Shape function of a 1-D -> 1-D op whose output length depends on the data.
inline absl::Status VectorInOut(shape_inference::InferenceContext* c) {
  shape_inference::ShapeHandle input;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &input));
  c->set_output(0, c->Vector(c->UnknownDim()));
  return absl::OkStatus();
}

// Runs work(b) for b in [0, num_blocks) on the op's CPU worker threads.
inline void ForEachBlock(OpKernelContext* ctx, int64_t num_blocks, int64_t cost_per_block,
                         const std::function<void(int64_t)>& work) {
  const auto* threads = ctx->device()->tensorflow_cpu_worker_threads();
  Shard(threads->num_threads, threads->workers, num_blocks, cost_per_block,
        [&work](int64_t begin, int64_t end) {
          for (int64_t b = begin; b < end; ++b) work(b);
        });
}

}  // namespace tfgc_ops
}  // namespace tensorflow

#endif  // TFGC_OPS_CC_OP_UTIL_H_
