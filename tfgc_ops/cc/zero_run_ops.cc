// TensorFlow ops around the zero-run codec in zero_run.h.
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "op_util.h"
#include "zero_run.h"

namespace tensorflow {
namespace tfgc_ops {
namespace {

// Fixed blocks keep the work split, and so the output, independent of the thread count.
constexpr int64_t kBlockBytes = 256 * 1024;

}  // namespace

REGISTER_OP("Tfgc>ZeroRunEncode")
    .Input("quartic: uint8")
    .Output("encoded: uint8")
    .SetShapeFn(VectorInOut)
    .Doc(R"doc(
Zero-run encoding of quartic-encoded bytes (3LC section 3.3).

quartic: 1-D bytes in 0..242.
encoded: runs of 2..14 bytes equal to 121 replaced by one byte 243 + (k - 2).
)doc");

REGISTER_OP("Tfgc>ZeroRunDecode")
    .Input("encoded: uint8")
    .Output("quartic: uint8")
    .SetShapeFn(VectorInOut)
    .Doc(R"doc(
Exact inverse of ZeroRunEncode. Total: every byte string decodes.
)doc");

class ZeroRunEncodeOp : public OpKernel {
 public:
  explicit ZeroRunEncodeOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& input = ctx->input(0);
    OP_REQUIRES(ctx, TensorShapeUtils::IsVector(input.shape()),
                errors::InvalidArgument("zero_run_encode expects a 1-D uint8 tensor, got shape ",
                                        input.shape().DebugString()));
    const uint8_t* in = input.flat<uint8>().data();
    // A TensorFlow temporary, so that an allocator that pools memory (BFC) spares the
    // page faults of a fresh buffer on every call.
    Tensor scratch;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(DT_UINT8, input.shape(), &scratch));
    tfgc::zero_run::ParallelEncoder encoder(in, input.NumElements(), kBlockBytes,
                                            scratch.flat<uint8>().data());
    ForEachBlock(ctx, encoder.num_blocks(), kBlockBytes,
                 [&encoder](int64_t b) { encoder.Summarize(b); });
    const int64_t invalid = encoder.FirstInvalidByte();
    OP_REQUIRES(ctx, invalid < 0,
                errors::InvalidArgument("zero_run_encode: byte ", invalid, " is ",
                                        static_cast<int>(in[invalid < 0 ? 0 : invalid]),
                                        "; quartic-encoded bytes must be in 0..242"));
    const int64_t size = encoder.Plan();
    Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({size}), &output));
    uint8_t* out = output->flat<uint8>().data();
    ForEachBlock(ctx, encoder.num_blocks(), kBlockBytes / 8,
                 [&encoder, out](int64_t b) { encoder.Write(b, out); });
  }
};

class ZeroRunDecodeOp : public OpKernel {
 public:
  explicit ZeroRunDecodeOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& input = ctx->input(0);
    OP_REQUIRES(ctx, TensorShapeUtils::IsVector(input.shape()),
                errors::InvalidArgument("zero_run_decode expects a 1-D uint8 tensor, got shape ",
                                        input.shape().DebugString()));
    const uint8_t* in = input.flat<uint8>().data();
    const int64_t n = input.NumElements();
    const int64_t num_blocks = (n + kBlockBytes - 1) / kBlockBytes;
    // Each input byte decodes to at most 14 bytes, so sizes stay far below int64's range.
    std::vector<int64_t> offsets(num_blocks + 1, 0);
    ForEachBlock(ctx, num_blocks, kBlockBytes, [&](int64_t b) {
      const int64_t begin = b * kBlockBytes;
      offsets[b + 1] = tfgc::zero_run::DecodedSize(in + begin, std::min(kBlockBytes, n - begin));
    });
    for (int64_t b = 0; b < num_blocks; ++b) offsets[b + 1] += offsets[b];
    Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({offsets[num_blocks]}), &output));
    uint8_t* out = output->flat<uint8>().data();
    ForEachBlock(ctx, num_blocks, 4 * kBlockBytes, [&](int64_t b) {
      const int64_t begin = b * kBlockBytes;
      tfgc::zero_run::Decode(in + begin, std::min(kBlockBytes, n - begin), out + offsets[b],
                             offsets[b + 1] - offsets[b]);
    });
  }
};

REGISTER_KERNEL_BUILDER(Name("Tfgc>ZeroRunEncode").Device(DEVICE_CPU), ZeroRunEncodeOp);
REGISTER_KERNEL_BUILDER(Name("Tfgc>ZeroRunDecode").Device(DEVICE_CPU), ZeroRunDecodeOp);

}  // namespace tfgc_ops
}  // namespace tensorflow
