// The TensorFlow ops around log_levels.h: LogQuant's encoder and decoder, one pass each.
#include <algorithm>
#include <cmath>
#include <limits>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "bit_packing.h"
#include "log_levels.h"
#include "op_util.h"

namespace tensorflow {
namespace tfgc_ops {
namespace {

constexpr int64_t kValuesPerBlock = 256 * 1024;  // a multiple of 8: blocks start on a byte

absl::Status LogLevelsEncodeShape(shape_inference::InferenceContext* c) {
  shape_inference::ShapeHandle input, scalar;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &input));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 0, &scalar));
  c->set_output(0, c->Vector(c->UnknownDim()));
  c->set_output(1, input);
  c->set_output(2, c->Scalar());
  return absl::OkStatus();
}

}  // namespace

REGISTER_OP("Tfgc>LogLevelsEncode")
    .Input("x: float")
    .Input("largest: float")
    .Attr("bits: int")
    .Output("packed: uint8")
    .Output("decoded: float")
    .Output("scale: float")
    .SetShapeFn(LogLevelsEncodeShape)
    .Doc(R"doc(
LogQuant's encoding in one pass. With fsr = ceil(log2 largest) (0 unless largest is
positive and finite), x_i gets level m = fsr - round(log2 |x_i|) + 1 when
1 <= m <= 2^(bits - 1) - 1, else 0 (also for 0, Inf and NaN); its code is m with x_i's
sign bit on top.

largest: max |x_i|, or NaN when some x_i is not finite (largest_magnitude).
packed: the codes, most significant bit first, in ceil(n * bits / 8) bytes.
decoded: what log_levels_decode gives for them (computed only where it is used).
scale: 2^fsr, or NaN when largest is not finite.
)doc");

REGISTER_OP("Tfgc>LogLevelsDecode")
    .Input("packed: uint8")
    .Input("scale: float")
    .Input("n: int64")
    .Attr("bits: int")
    .Output("values: float")
    .SetShapeFn(UnknownVectorOut)
    .Doc(R"doc(
LogQuant's values from n sign-level codes of `bits` bits packed in exactly
ceil(n * bits / 8) bytes: level m = 0 is 0, m >= 1 is +-scale * 2^(1 - m); a scale that
is not finite gives +-scale everywhere.
)doc");

class LogLevelsDecodeOp : public OpKernel {
 public:
  explicit LogLevelsDecodeOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("bits", &bits_));
    OP_REQUIRES(ctx, bits_ >= 2 && bits_ <= 8,
                errors::InvalidArgument("log_levels_decode: bits must be in [2, 8], got ", bits_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& packed = ctx->input(0);
    OP_REQUIRES_OK(ctx, CheckVector(packed, "log_levels_decode"));
    OP_REQUIRES_OK(ctx, CheckScalar(ctx->input(1), "log_levels_decode", "scale"));
    OP_REQUIRES_OK(ctx, CheckScalar(ctx->input(2), "log_levels_decode", "n"));
    const float scale = ctx->input(1).scalar<float>()();
    const int64_t n = ctx->input(2).scalar<int64_t>()();
    OP_REQUIRES_OK(ctx, CheckPackedCount(packed.NumElements(), n, bits_, "log_levels_decode"));
    Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n}), &output));
    const uint8_t* in = packed.flat<uint8>().data();
    float* out = output->flat<float>().data();
    const int bits = bits_;
    const int64_t blocks = n / kValuesPerBlock + (n % kValuesPerBlock != 0);
    ForEachBlock(ctx, blocks, 4 * kValuesPerBlock, [=](int64_t b) {
      ::tfgc::log_levels::Decode(in, n, bits, scale, b * kValuesPerBlock,
                                 std::min(n, (b + 1) * kValuesPerBlock), out);
    });
  }

 private:
  int bits_;
};

class LogLevelsEncodeOp : public OpKernel {
 public:
  explicit LogLevelsEncodeOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("bits", &bits_));
    OP_REQUIRES(ctx, bits_ >= 2 && bits_ <= 8,
                errors::InvalidArgument("log_levels_encode: bits must be in [2, 8], got ", bits_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x = ctx->input(0);
    OP_REQUIRES_OK(ctx, CheckVector(x, "log_levels_encode"));
    OP_REQUIRES_OK(ctx, CheckScalar(ctx->input(1), "log_levels_encode", "largest"));
    const float largest = ctx->input(1).scalar<float>()();
    const int full_scale = ::tfgc::log_levels::FullScale(largest);
    const float scale = std::isfinite(largest) ? ::tfgc::log_levels::Scale(full_scale)
                                               : std::numeric_limits<float>::quiet_NaN();
    const int64_t n = x.NumElements();
    Tensor *packed = nullptr, *decoded = nullptr, *scale_out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            0, TensorShape({::tfgc::bit_packing::PackedSize(n, bits_)}), &packed));
    float* values = nullptr;
    if (ctx->output_required(1)) {
      OP_REQUIRES_OK(ctx, ctx->allocate_output(1, x.shape(), &decoded));
      values = decoded->flat<float>().data();
    }
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({}), &scale_out));
    scale_out->scalar<float>()() = scale;
    const float* in = x.flat<float>().data();
    uint8_t* out = packed->flat<uint8>().data();
    const int bits = bits_;
    const int64_t blocks = n / kValuesPerBlock + (n % kValuesPerBlock != 0);
    ForEachBlock(ctx, blocks, 8 * kValuesPerBlock, [=](int64_t b) {
      ::tfgc::log_levels::Encode(in, b * kValuesPerBlock, std::min(n, (b + 1) * kValuesPerBlock),
                                 bits, full_scale, scale, out, values);
    });
  }

 private:
  int bits_;
};

REGISTER_KERNEL_BUILDER(Name("Tfgc>LogLevelsEncode").Device(DEVICE_CPU), LogLevelsEncodeOp);
REGISTER_KERNEL_BUILDER(Name("Tfgc>LogLevelsDecode").Device(DEVICE_CPU), LogLevelsDecodeOp);

}  // namespace tfgc_ops
}  // namespace tensorflow
