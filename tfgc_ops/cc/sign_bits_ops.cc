// TensorFlow ops around the one-bit sign quantizer in sign_bits.h: OneBit's and
// ScaledSign's encode, and Signum's momentum update with it.
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

absl::Status MomentumSignBitsShape(shape_inference::InferenceContext* c) {
  shape_inference::ShapeHandle momentum, x, beta;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &momentum));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &x));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 0, &beta));
  TF_RETURN_IF_ERROR(c->Merge(momentum, x, &x));
  c->set_output(0, x);
  c->set_output(1, c->Vector(shape_inference::InferenceContext::kUnknownDim));
  c->set_output(2, c->Vector(2));
  c->set_output(3, c->Vector(2));
  return absl::OkStatus();
}

REGISTER_OP("Tfgc>MomentumSignBitsEncode")
    .Input("momentum: float")
    .Input("x: float")
    .Input("beta: float")
    .Output("updated: float")
    .Output("packed: uint8")
    .Output("sums: double")
    .Output("counts: int64")
    .SetShapeFn(MomentumSignBitsShape)
    .Doc(R"doc(
Signum's sender step in one pass: updated = beta * momentum + x (float32, the product
rounded and then the sum, as Mul then Add round them), and SignBitsEncode(updated).

updated: the new momentum (the caller decides whether to keep it).
packed, sums, counts: SignBitsEncode's outputs for `updated`, bit for bit.
)doc");

class MomentumSignBitsEncodeOp : public OpKernel {
 public:
  explicit MomentumSignBitsEncodeOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& momentum = ctx->input(0);
    const Tensor& x = ctx->input(1);
    const Tensor& beta = ctx->input(2);
    OP_REQUIRES_OK(ctx, CheckVector(momentum, "momentum_sign_bits_encode"));
    OP_REQUIRES_OK(ctx, CheckVector(x, "momentum_sign_bits_encode"));
    OP_REQUIRES_OK(ctx, CheckScalar(beta, "momentum_sign_bits_encode", "beta"));
    const int64_t n = x.NumElements();
    OP_REQUIRES(ctx, momentum.NumElements() == n,
                errors::InvalidArgument("momentum_sign_bits_encode: momentum has ",
                                        momentum.NumElements(), " values, x ", n));
    // Each value is read before its update is written, so the update may take over x's
    // buffer where nothing else holds it.
    Tensor *updated = nullptr, *packed = nullptr, *sums = nullptr, *counts = nullptr;
    OP_REQUIRES_OK(ctx, ctx->forward_input_or_allocate_output({1}, 0, x.shape(), &updated));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({(n + 7) / 8}), &packed));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({2}), &sums));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, TensorShape({2}), &counts));
    const float* old = momentum.flat<float>().data();
    const float* in = x.flat<float>().data();
    const float factor = beta.scalar<float>()();
    float* next = updated->flat<float>().data();
    uint8_t* out = packed->flat<uint8>().data();
    const int64_t blocks = (n + kValuesPerBlock - 1) / kValuesPerBlock;
    std::vector<sb::SideSums> partial(blocks);
    ForEachBlock(ctx, blocks, 12 * kValuesPerBlock, [&](int64_t b) {
      const int64_t begin = b * kValuesPerBlock;
      partial[b] = sb::EncodeMomentum(old, in, factor, begin,
                                      std::min(n, begin + kValuesPerBlock), next, out);
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

REGISTER_KERNEL_BUILDER(Name("Tfgc>MomentumSignBitsEncode").Device(DEVICE_CPU),
                        MomentumSignBitsEncodeOp);

}  // namespace tfgc_ops
}  // namespace tensorflow
