// Helpers shared by the op files: a shape function and block-parallel loops.
#ifndef TFGC_OPS_CC_OP_UTIL_H_
#define TFGC_OPS_CC_OP_UTIL_H_

#include <functional>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/util/work_sharder.h"
#include "bit_packing.h"
#include "zero_run.h"

namespace tensorflow {
namespace tfgc_ops {

// Shape function of a 1-D -> 1-D op whose output length depends on the data.
inline absl::Status VectorInOut(shape_inference::InferenceContext* c) {
  shape_inference::ShapeHandle input;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &input));
  c->set_output(0, c->Vector(c->UnknownDim()));
  return absl::OkStatus();
}

// Shape function of an op whose one output is 1-D of a length its inputs' values give.
inline absl::Status UnknownVectorOut(shape_inference::InferenceContext* c) {
  c->set_output(0, c->Vector(c->UnknownDim()));
  return absl::OkStatus();
}

// OK if `t` is 1-D, else InvalidArgument naming the op.
inline absl::Status CheckVector(const Tensor& t, const char* op) {
  if (!TensorShapeUtils::IsVector(t.shape())) {
    return errors::InvalidArgument(op, " expects a 1-D tensor, got shape ",
                                   t.shape().DebugString());
  }
  return absl::OkStatus();
}

// OK if `t` is a scalar, else InvalidArgument naming the op and `what` it is.
inline absl::Status CheckScalar(const Tensor& t, const char* op, const char* what) {
  if (!TensorShapeUtils::IsScalar(t.shape())) {
    return errors::InvalidArgument(op, ": ", what, " must be a scalar, got shape ",
                                   t.shape().DebugString());
  }
  return absl::OkStatus();
}

// OK if `size` bytes hold exactly n codes of `bits` bits (checked without overflow, so
// before anything of n elements is allocated), else InvalidArgument naming the op.
inline absl::Status CheckPackedCount(int64_t size, int64_t n, int bits, const char* op) {
  namespace bp = ::tfgc::bit_packing;
  if (n >= 0 && n <= bp::MaxCodes(size, bits) && bp::PackedSize(n, bits) == size) {
    return absl::OkStatus();
  }
  return errors::InvalidArgument(op, ": ", size, " bytes do not hold exactly ", n,
                                 " codes of ", bits, " bits");
}

// OK if every byte of in[0, n) is a quartic byte (0..242), else InvalidArgument naming
// the op and the first byte that is not.
inline absl::Status CheckQuartic(const uint8_t* in, int64_t n, const char* op) {
  const int64_t invalid = ::tfgc::zero_run::FindInvalidByte(in, n);
  if (invalid < 0) return absl::OkStatus();
  return errors::InvalidArgument(op, ": byte ", invalid, " is ", static_cast<int>(in[invalid]),
                                 "; quartic-encoded bytes must be in 0..242");
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
