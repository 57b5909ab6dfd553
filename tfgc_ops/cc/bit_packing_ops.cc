// TensorFlow ops around the bit packing in bit_packing.h.
#include <algorithm>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "bit_packing.h"
#include "op_util.h"

namespace tensorflow {
namespace tfgc_ops {
namespace {

namespace bp = ::tfgc::bit_packing;

// Codes per block: a multiple of 8, so that blocks start on a byte.
constexpr int64_t kBlockCodes = 64 * 1024;

// The `bits` input as an int in 1..8, or an error naming the op.
absl::Status BitsOf(OpKernelContext* ctx, const char* op, int* bits) {
  const Tensor& t = ctx->input(1);
  if (!TensorShapeUtils::IsScalar(t.shape())) {
    return errors::InvalidArgument(op, ": bits must be a scalar, got shape ",
                                   t.shape().DebugString());
  }
  const int32 value = t.scalar<int32>()();
  if (value < bp::kMinBits || value > bp::kMaxBits) {
    return errors::InvalidArgument(op, ": bits must be in [1, 8], got ", value);
  }
  *bits = value;
  return absl::OkStatus();
}

absl::Status UnpackBitsShape(shape_inference::InferenceContext* c) {
  shape_inference::ShapeHandle unused;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &unused));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 0, &unused));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 0, &unused));
  shape_inference::DimensionHandle n;
  TF_RETURN_IF_ERROR(c->MakeDimForScalarInput(2, &n));
  c->set_output(0, c->Vector(n));
  return absl::OkStatus();
}

}  // namespace

REGISTER_OP("Tfgc>PackBits")
    .Input("codes: int32")
    .Input("bits: int32")
    .Output("packed: uint8")
    .SetShapeFn(VectorInOut)
    .Doc(R"doc(
Packs codes of `bits` bits (1..8) into bytes, most significant bit first.

codes: 1-D, each in [0, 2^bits).
packed: ceil(n * bits / 8) bytes, the last one zero-padded.
)doc");

REGISTER_OP("Tfgc>UnpackBits")
    .Input("packed: uint8")
    .Input("bits: int32")
    .Input("n: int64")
    .Output("codes: int32")
    .SetShapeFn(UnpackBitsShape)
    .Doc(R"doc(
Inverse of PackBits: the n codes of `bits` bits in `packed`, which must be exactly
ceil(n * bits / 8) bytes long.
)doc");

class PackBitsOp : public OpKernel {
 public:
  explicit PackBitsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& codes = ctx->input(0);
    OP_REQUIRES(ctx, TensorShapeUtils::IsVector(codes.shape()),
                errors::InvalidArgument("pack_bits expects 1-D int32 codes, got shape ",
                                        codes.shape().DebugString()));
    int bits = 0;
    OP_REQUIRES_OK(ctx, BitsOf(ctx, "pack_bits", &bits));
    const int64_t n = codes.NumElements();
    Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({bp::PackedSize(n, bits)}), &output));
    const int32_t* in = codes.flat<int32>().data();
    uint8_t* out = output->flat<uint8>().data();
    const int64_t num_blocks = (n + kBlockCodes - 1) / kBlockCodes;
    std::vector<int64_t> first_bad(num_blocks, -1);
    ForEachBlock(ctx, num_blocks, kBlockCodes, [&](int64_t b) {
      const int64_t begin = b * kBlockCodes;
      const int64_t bad = bp::Pack(in + begin, std::min(kBlockCodes, n - begin), bits,
                                   out + begin / 8 * bits);
      if (bad >= 0) first_bad[b] = begin + bad;
    });
    for (int64_t bad : first_bad) {
      OP_REQUIRES(ctx, bad < 0,
                  errors::InvalidArgument("pack_bits: code ", bad, " is ", in[bad < 0 ? 0 : bad],
                                          "; codes of ", bits, " bits must be in [0, ",
                                          1 << bits, ")"));
    }
  }
};

class UnpackBitsOp : public OpKernel {
 public:
  explicit UnpackBitsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& packed = ctx->input(0);
    OP_REQUIRES(ctx, TensorShapeUtils::IsVector(packed.shape()),
                errors::InvalidArgument("unpack_bits expects 1-D uint8 bytes, got shape ",
                                        packed.shape().DebugString()));
    int bits = 0;
    OP_REQUIRES_OK(ctx, BitsOf(ctx, "unpack_bits", &bits));
    const Tensor& count = ctx->input(2);
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(count.shape()),
                errors::InvalidArgument("unpack_bits: n must be a scalar, got shape ",
                                        count.shape().DebugString()));
    const int64_t n = count.scalar<int64_t>()();
    const int64_t size = packed.NumElements();
    // Checked before anything is allocated: the output is bounded by what the bytes hold.
    OP_REQUIRES(ctx, n >= 0 && n <= bp::MaxCodes(size, bits) && bp::PackedSize(n, bits) == size,
                errors::InvalidArgument("unpack_bits: ", n, " codes of ", bits,
                                        " bits do not take exactly the ", size,
                                        " bytes given"));
    Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n}), &output));
    const uint8_t* in = packed.flat<uint8>().data();
    int32_t* out = output->flat<int32>().data();
    const int64_t num_blocks = (n + kBlockCodes - 1) / kBlockCodes;
    ForEachBlock(ctx, num_blocks, kBlockCodes, [&](int64_t b) {
      const int64_t begin = b * kBlockCodes;
      bp::Unpack(in + begin / 8 * bits, std::min(kBlockCodes, n - begin), bits, out + begin);
    });
  }
};

REGISTER_KERNEL_BUILDER(Name("Tfgc>PackBits").Device(DEVICE_CPU), PackBitsOp);
REGISTER_KERNEL_BUILDER(Name("Tfgc>UnpackBits").Device(DEVICE_CPU), UnpackBitsOp);

}  // namespace tfgc_ops
}  // namespace tensorflow
