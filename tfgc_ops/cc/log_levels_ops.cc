// The TensorFlow op around log_levels.h: LogQuant's decoder in one pass.
#include <algorithm>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "log_levels.h"
#include "op_util.h"

namespace tensorflow {
namespace tfgc_ops {
namespace {

constexpr int64_t kValuesPerBlock = 256 * 1024;  // a multiple of 8: blocks start on a byte

}  // namespace

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

REGISTER_KERNEL_BUILDER(Name("Tfgc>LogLevelsDecode").Device(DEVICE_CPU), LogLevelsDecodeOp);

}  // namespace tfgc_ops
}  // namespace tensorflow
