// TensorFlow ops around 3LC's quantization and folding in quartic_fold.h.
#include <cmath>
#include <cstring>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "op_util.h"
#include "quartic_fold.h"

namespace tensorflow {
namespace tfgc_ops {
namespace {

namespace qf = ::tfgc::quartic_fold;

// Groups of five values per block of work: large enough that a block costs more than
// handing it to a thread.
constexpr int64_t kGroupsPerBlock = 64 * 1024;

absl::Status ScalarOut(shape_inference::InferenceContext* c) {
  shape_inference::ShapeHandle input;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &input));
  c->set_output(0, c->Scalar());
  return absl::OkStatus();
}

}  // namespace

REGISTER_OP("Tfgc>LargestMagnitude")
    .Input("x: float")
    .Output("largest: float")
    .SetShapeFn(ScalarOut)
    .Doc(R"doc(
max |x| of a 1-D tensor; NaN if a value is not finite, 0 if it is empty.
)doc");

REGISTER_OP("Tfgc>QuarticFold")
    .Input("x: float")
    .Input("scale: float")
    .Output("quartic: uint8")
    .SetShapeFn(VectorInOut)
    .Doc(R"doc(
3LC's quantization and quartic folding (sections 3.1-3.2) in one pass.

x: 1-D values.
scale: M. q = round-half-even(x / M), clamped to [-1, 1]; all 3-values are 0 when M is
  not > 0 (zero or NaN).
quartic: ceil(n / 5) bytes, byte i = sum over k of (q[k g + i] + 1) 3^(4 - k), the pad 0.
)doc");

REGISTER_OP("Tfgc>QuarticUnfold")
    .Input("quartic: uint8")
    .Input("n: int64")
    .Input("scale: float")
    .Output("values: float")
    .SetShapeFn(UnknownVectorOut)
    .Doc(R"doc(
Inverse of QuarticFold: the n values q * scale held by exactly ceil(n / 5) bytes.
)doc");

class LargestMagnitudeOp : public OpKernel {
 public:
  explicit LargestMagnitudeOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x = ctx->input(0);
    OP_REQUIRES_OK(ctx, CheckVector(x, "largest_magnitude"));
    Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &output));
    output->scalar<float>()() = qf::LargestMagnitude(x.flat<float>().data(), x.NumElements());
  }
};

class QuarticFoldOp : public OpKernel {
 public:
  explicit QuarticFoldOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x = ctx->input(0);
    OP_REQUIRES_OK(ctx, CheckVector(x, "quartic_fold"));
    OP_REQUIRES_OK(ctx, CheckScalar(ctx->input(1), "quartic_fold", "scale"));
    const float scale = ctx->input(1).scalar<float>()();
    const int64_t n = x.NumElements();
    const int64_t groups = qf::GroupsFor(n);
    Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({groups}), &output));
    uint8_t* out = output->flat<uint8>().data();
    if (!(scale > 0)) {  // zero or NaN: every 3-value is 0
      std::memset(out, 121, groups);
      return;
    }
    const float* in = x.flat<float>().data();
    const int64_t blocks = (groups + kGroupsPerBlock - 1) / kGroupsPerBlock;
    ForEachBlock(ctx, blocks, 5 * 4 * kGroupsPerBlock, [=](int64_t b) {
      qf::Fold(in, n, scale, b * kGroupsPerBlock, std::min(groups, (b + 1) * kGroupsPerBlock),
               out);
    });
  }
};

class QuarticUnfoldOp : public OpKernel {
 public:
  explicit QuarticUnfoldOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& quartic = ctx->input(0);
    OP_REQUIRES_OK(ctx, CheckVector(quartic, "quartic_unfold"));
    OP_REQUIRES_OK(ctx, CheckScalar(ctx->input(1), "quartic_unfold", "n"));
    OP_REQUIRES_OK(ctx, CheckScalar(ctx->input(2), "quartic_unfold", "scale"));
    const int64_t n = ctx->input(1).scalar<int64_t>()();
    const int64_t groups = quartic.NumElements();
    // n is checked against the bytes before anything of size n is allocated.
    OP_REQUIRES(ctx, n >= 0 && n <= 5 * groups && qf::GroupsFor(n) == groups,
                errors::InvalidArgument("quartic_unfold: ", groups, " bytes do not hold ", n,
                                        " values (that takes ceil(n / 5) bytes)"));
    const uint8_t* in = quartic.flat<uint8>().data();
    OP_REQUIRES_OK(ctx, CheckQuartic(in, groups, "quartic_unfold"));
    const float scale = ctx->input(2).scalar<float>()();
    Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n}), &output));
    float* out = output->flat<float>().data();
    const int64_t blocks = (groups + kGroupsPerBlock - 1) / kGroupsPerBlock;
    ForEachBlock(ctx, blocks, 5 * 4 * kGroupsPerBlock, [=](int64_t b) {
      qf::Unfold(in, n, scale, b * kGroupsPerBlock, std::min(groups, (b + 1) * kGroupsPerBlock),
                 out);
    });
  }
};

REGISTER_KERNEL_BUILDER(Name("Tfgc>LargestMagnitude").Device(DEVICE_CPU), LargestMagnitudeOp);
REGISTER_KERNEL_BUILDER(Name("Tfgc>QuarticFold").Device(DEVICE_CPU), QuarticFoldOp);
REGISTER_KERNEL_BUILDER(Name("Tfgc>QuarticUnfold").Device(DEVICE_CPU), QuarticUnfoldOp);

}  // namespace tfgc_ops
}  // namespace tensorflow
