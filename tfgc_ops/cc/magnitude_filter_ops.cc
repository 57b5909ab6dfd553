// TensorFlow op around FastSGD's threshold filter in magnitude_filter.h.
#include <algorithm>
#include <limits>
#include <utility>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "magnitude_filter.h"
#include "op_util.h"

namespace tensorflow {
namespace tfgc_ops {
namespace {

namespace mf = ::tfgc::magnitude_filter;

// Fixed blocks keep the sum, added per block and then in block order, independent of
// the thread count.
constexpr int64_t kValuesPerBlock = 64 * 1024;

}  // namespace

REGISTER_OP("Tfgc>MagnitudeFilter")
    .Input("v: T")
    .Input("factor: double")
    .Attr("T: {float, double}")
    .Output("sum: double")
    .Output("positions: int64")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      shape_inference::ShapeHandle input;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &input));
      c->set_output(0, c->Scalar());
      c->set_output(1, c->Vector(shape_inference::InferenceContext::kUnknownDim));
      return absl::OkStatus();
    })
    .Doc(R"doc(
FastSGD's threshold filter (Algorithm 1 with its early stop) in two passes.

sum: the sum of |v| over the finite values, in double, rounded to T (what the receiver
  reads); NaN when a value is not finite.
positions: ascending, of the values with 0 < |v| >= sum * factor, and of the values that
  are not finite.
)doc");

template <typename T>
class MagnitudeFilterOp : public OpKernel {
 public:
  explicit MagnitudeFilterOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& v = ctx->input(0);
    OP_REQUIRES_OK(ctx, CheckVector(v, "magnitude_filter"));
    OP_REQUIRES_OK(ctx, CheckScalar(ctx->input(1), "magnitude_filter", "factor"));
    const double factor = ctx->input(1).scalar<double>()();
    const T* in = v.flat<T>().data();
    const int64_t n = v.NumElements();
    const int64_t blocks = (n + kValuesPerBlock - 1) / kValuesPerBlock;
    auto block_range = [n](int64_t b) {
      return std::make_pair(b * kValuesPerBlock, std::min(n, (b + 1) * kValuesPerBlock));
    };

    std::vector<mf::MagnitudeSum> sums(blocks);
    ForEachBlock(ctx, blocks, 4 * kValuesPerBlock, [&](int64_t b) {
      const auto [begin, end] = block_range(b);
      sums[b] = mf::SumMagnitudes(in, begin, end);
    });
    double sum = 0.0;
    bool finite = true;
    for (const mf::MagnitudeSum& s : sums) {
      sum += s.sum;
      finite &= s.finite;
    }
    sum = static_cast<double>(static_cast<T>(sum));  // as received
    if (!finite) sum = std::numeric_limits<double>::quiet_NaN();

    std::vector<std::vector<int64_t>> found(blocks);
    const double floor = sum * factor;
    ForEachBlock(ctx, blocks, 4 * kValuesPerBlock, [&](int64_t b) {
      const auto [begin, end] = block_range(b);
      mf::AppendCandidates(in, begin, end, floor, &found[b]);
    });
    int64_t count = 0;
    for (const auto& f : found) count += static_cast<int64_t>(f.size());
    Tensor *sum_out = nullptr, *positions = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &sum_out));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({count}), &positions));
    sum_out->scalar<double>()() = sum;
    int64_t* out = positions->flat<int64_t>().data();
    for (const auto& f : found) out = std::copy(f.begin(), f.end(), out);
  }
};

REGISTER_KERNEL_BUILDER(
    Name("Tfgc>MagnitudeFilter").Device(DEVICE_CPU).TypeConstraint<float>("T"),
    MagnitudeFilterOp<float>);
REGISTER_KERNEL_BUILDER(
    Name("Tfgc>MagnitudeFilter").Device(DEVICE_CPU).TypeConstraint<double>("T"),
    MagnitudeFilterOp<double>);

}  // namespace tfgc_ops
}  // namespace tensorflow
