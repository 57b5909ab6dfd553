// TensorFlow op around the one-bit sign quantizer in sign_bits.h.
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "op_util.h"
#include "sign_bits.h"

namespace tensorflow {
namespace tfgc_ops {
namespace {

namespace sb = ::tfgc::sign_bits;

// Fixed blocks (a multiple of 8 values) keep the sums, added per block and then in block
// order, independent of the thread count.
constexpr int64_t kValuesPerBlock = 64 * 1024;

absl::Status SignBitsShape(shape_inference::InferenceContext* c) {
  shape_inference::ShapeHandle input;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &input));
  c->set_output(0, c->Vector(shape_inference::InferenceContext::kUnknownDim));
  c->set_output(1, c->Vector(2));
  c->set_output(2, c->Vector(2));
  return absl::OkStatus();
}

}  // namespace

REGISTER_OP("Tfgc>SignBitsEncode")
    .Input("x: float")
    .Output("packed: uint8")
    .Output("sums: double")
    .Output("counts: int64")
    .SetShapeFn(SignBitsShape)
    .Doc(R"doc(
One-bit sign quantization in one pass: bit i (most significant first) is x_i >= 0.

packed: ceil(n / 8) bytes, the last zero-padded.
sums: the sums, in double, of the values >= 0 and of the others (NaN among them).
counts: how many values each sum holds.
)doc");

class SignBitsEncodeOp : public OpKernel {
 public:
  explicit SignBitsEncodeOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x = ctx->input(0);
    OP_REQUIRES_OK(ctx, CheckVector(x, "sign_bits_encode"));
    const int64_t n = x.NumElements();
    Tensor *packed = nullptr, *sums = nullptr, *counts = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({(n + 7) / 8}), &packed));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({2}), &sums));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({2}), &counts));
    const float* in = x.flat<float>().data();
    uint8_t* out = packed->flat<uint8>().data();
    const int64_t blocks = (n + kValuesPerBlock - 1) / kValuesPerBlock;
    std::vector<sb::SideSums> partial(blocks);
    ForEachBlock(ctx, blocks, 4 * kValuesPerBlock, [&](int64_t b) {
      const int64_t begin = b * kValuesPerBlock;
      partial[b] = sb::Encode(in, begin, std::min(n, begin + kValuesPerBlock), out);
    });
    auto sum = sums->flat<double>();
    auto count = counts->flat<int64_t>();
    for (int side = 0; side < 2; ++side) {
      sum(side) = 0.0;
      count(side) = 0;
      for (const sb::SideSums& p : partial) {
        sum(side) += p.sum[side];
        count(side) += p.count[side];
      }
    }
  }
};

REGISTER_KERNEL_BUILDER(Name("Tfgc>SignBitsEncode").Device(DEVICE_CPU), SignBitsEncodeOp);

}  // namespace tfgc_ops
}  // namespace tensorflow
