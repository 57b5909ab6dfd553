// TensorFlow ops around uniform_quantize.h: a tensor's range in one pass, and its uniform
// K-bit codes, packed, with their reconstruction, in a second.
#include <algorithm>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "op_util.h"
#include "uniform_quantize.h"

namespace tensorflow {
namespace tfgc_ops {
namespace {

namespace uq = ::tfgc::uniform_quantize;

// Fixed blocks (a multiple of 8 values, so that each starts on a byte of the packed codes)
// keep the sum of squares, added per block and then in block order, independent of the
// thread count.
constexpr int64_t kValuesPerBlock = 64 * 1024;

int64_t Blocks(int64_t n) { return (n + kValuesPerBlock - 1) / kValuesPerBlock; }

absl::Status ValueRangeShape(shape_inference::InferenceContext* c) {
  shape_inference::ShapeHandle input;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &input));
  c->set_output(0, c->Vector(2));
  c->set_output(1, c->Scalar());
  c->set_output(2, c->Scalar());
  return absl::OkStatus();
}

absl::Status UniformQuantizeShape(shape_inference::InferenceContext* c) {
  shape_inference::ShapeHandle input, scalar;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &input));
  for (int k = 1; k < 4; ++k) TF_RETURN_IF_ERROR(c->WithRank(c->input(k), 0, &scalar));
  c->set_output(0, c->Vector(c->UnknownDim()));
  c->set_output(1, input);
  return absl::OkStatus();
}

}  // namespace

REGISTER_OP("Tfgc>ValueRange")
    .Input("x: float")
    .Output("extremes: float")
    .Output("finite: bool")
    .Output("sum_squares: double")
    .SetShapeFn(ValueRangeShape)
    .Doc(R"doc(
A tensor's range in one pass.

extremes: [min, max] of x ([+inf, -inf] for an empty x; unspecified unless finite).
finite: whether every value is finite.
sum_squares: the sum of x_i^2 in double.
)doc");

REGISTER_OP("Tfgc>UniformQuantize")
    .Input("x: float")
    .Input("low: float")
    .Input("step: float")
    .Input("bits: int32")
    .Output("packed: uint8")
    .Output("reconstructed: float")
    .SetShapeFn(UniformQuantizeShape)
    .Doc(R"doc(
Uniform quantization in one pass: code q_i = round((x_i - low) / d), ties to even, with
d = step if step > 0 else 1, clamped to [0, 2^bits - 1]; NaN quotients give 0.

packed: the codes of `bits` bits (1..8), most significant bit first, in
  ceil(n * bits / 8) bytes, the last zero-padded.
reconstructed: low + q_i * step (computed only where it is used).
)doc");

class ValueRangeOp : public OpKernel {
 public:
  explicit ValueRangeOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x = ctx->input(0);
    OP_REQUIRES_OK(ctx, CheckVector(x, "value_range"));
    const int64_t n = x.NumElements();
    const float* in = x.flat<float>().data();
    std::vector<uq::Range> partial(Blocks(n));
    ForEachBlock(ctx, partial.size(), 2 * kValuesPerBlock, [&](int64_t b) {
      const int64_t begin = b * kValuesPerBlock;
      partial[b] = uq::Measure(in, begin, std::min(n, begin + kValuesPerBlock));
    });
    uq::Range range = uq::Measure(in, 0, 0);
    for (const uq::Range& p : partial) range = uq::Combine(range, p);
    Tensor *extremes = nullptr, *finite = nullptr, *sum_squares = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({2}), &extremes));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({}), &finite));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({}), &sum_squares));
    extremes->flat<float>()(0) = range.low;
    extremes->flat<float>()(1) = range.high;
    finite->scalar<bool>()() = range.finite;
    sum_squares->scalar<double>()() = range.sum_squares;
  }
};

class UniformQuantizeOp : public OpKernel {
 public:
  explicit UniformQuantizeOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x = ctx->input(0);
    OP_REQUIRES_OK(ctx, CheckVector(x, "uniform_quantize"));
    OP_REQUIRES_OK(ctx, CheckScalar(ctx->input(1), "uniform_quantize", "low"));
    OP_REQUIRES_OK(ctx, CheckScalar(ctx->input(2), "uniform_quantize", "step"));
    OP_REQUIRES_OK(ctx, CheckScalar(ctx->input(3), "uniform_quantize", "bits"));
    const float low = ctx->input(1).scalar<float>()();
    const float step = ctx->input(2).scalar<float>()();
    const int bits = ctx->input(3).scalar<int32>()();
    OP_REQUIRES(ctx, bits >= ::tfgc::bit_packing::kMinBits && bits <= ::tfgc::bit_packing::kMaxBits,
                errors::InvalidArgument("uniform_quantize: bits must be in [1, 8], got ", bits));
    const int64_t n = x.NumElements();
    Tensor *packed = nullptr, *reconstructed = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            0, TensorShape({::tfgc::bit_packing::PackedSize(n, bits)}), &packed));
    float* values = nullptr;
    if (ctx->output_required(1)) {
      OP_REQUIRES_OK(ctx, ctx->allocate_output(1, x.shape(), &reconstructed));
      values = reconstructed->flat<float>().data();
    }
    const float* in = x.flat<float>().data();
    uint8_t* out = packed->flat<uint8>().data();
    ForEachBlock(ctx, Blocks(n), 8 * kValuesPerBlock, [=](int64_t b) {
      const int64_t begin = b * kValuesPerBlock;
      uq::Quantize(in, begin, std::min(n, begin + kValuesPerBlock), low, step, bits, out, values);
    });
  }
};

REGISTER_KERNEL_BUILDER(Name("Tfgc>ValueRange").Device(DEVICE_CPU), ValueRangeOp);
REGISTER_KERNEL_BUILDER(Name("Tfgc>UniformQuantize").Device(DEVICE_CPU), UniformQuantizeOp);

}  // namespace tfgc_ops
}  // namespace tensorflow
