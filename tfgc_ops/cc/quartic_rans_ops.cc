// TensorFlow ops around the quartic entropy coder in quartic_rans.h.
#include <cstring>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "op_util.h"
#include "quartic_rans.h"

namespace tensorflow {
namespace tfgc_ops {
namespace {

namespace qr = ::tfgc::quartic_rans;

// The group sizes as a vector, each >= 0; their sum in *total (which cannot overflow:
// each is checked against the remaining room first).
absl::Status ReadGroups(const Tensor& groups, const char* op, std::vector<int64_t>* sizes,
                        int64_t* total) {
  if (!TensorShapeUtils::IsVector(groups.shape())) {
    return errors::InvalidArgument(op, ": groups must be a 1-D int64 tensor, got shape ",
                                   groups.shape().DebugString());
  }
  const auto flat = groups.flat<int64_t>();
  sizes->assign(flat.data(), flat.data() + flat.size());
  *total = 0;
  for (size_t g = 0; g < sizes->size(); ++g) {
    const int64_t size = (*sizes)[g];
    if (size < 0 || size > (int64_t{1} << 58) - *total) {
      return errors::InvalidArgument(op, ": group ", g, " has size ", size,
                                     "; sizes must be >= 0 and sum below 2^58");
    }
    *total += size;
  }
  return absl::OkStatus();
}

}  // namespace

REGISTER_OP("Tfgc>QuarticEntropyEncode")
    .Input("quartic: uint8")
    .Input("groups: int64")
    .Output("encoded: uint8")
    .SetShapeFn(VectorInOut)
    .Doc(R"doc(
rANS coding of quartic bytes under a per-group model of independent 3-values.

quartic: 1-D bytes in 0..242, the groups one after another.
groups: 1-D sizes of the groups (e.g. one per tensor); they must sum to quartic's length.
encoded: a uint16 per group, the final rANS state, then the stream (quartic_rans.h).
)doc");

REGISTER_OP("Tfgc>QuarticEntropyDecode")
    .Input("encoded: uint8")
    .Input("groups: int64")
    .Output("quartic: uint8")
    .SetShapeFn(VectorInOut)
    .Doc(R"doc(
Exact inverse of QuarticEntropyEncode for the same groups. The output's size is the sum
of groups, known to the receiver; an encoding that does not decode to exactly that is
rejected with InvalidArgument.
)doc");

class QuarticEntropyEncodeOp : public OpKernel {
 public:
  explicit QuarticEntropyEncodeOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& input = ctx->input(0);
    OP_REQUIRES_OK(ctx, CheckVector(input, "quartic_entropy_encode"));
    std::vector<int64_t> groups;
    int64_t total = 0;
    OP_REQUIRES_OK(ctx, ReadGroups(ctx->input(1), "quartic_entropy_encode", &groups, &total));
    const int64_t n = input.NumElements();
    OP_REQUIRES(ctx, total == n,
                errors::InvalidArgument("quartic_entropy_encode: groups sum to ", total,
                                        " bytes but the input has ", n));
    const uint8_t* in = input.flat<uint8>().data();
    OP_REQUIRES_OK(ctx, CheckQuartic(in, n, "quartic_entropy_encode"));
    std::vector<uint8_t> scratch(qr::MaxEncodedSize(n, groups.size()));
    const int64_t size = qr::Encode(in, groups.data(), groups.size(), scratch.data());
    Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({size}), &output));
    std::memcpy(output->flat<uint8>().data(), scratch.data(), size);
  }
};

class QuarticEntropyDecodeOp : public OpKernel {
 public:
  explicit QuarticEntropyDecodeOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& input = ctx->input(0);
    OP_REQUIRES_OK(ctx, CheckVector(input, "quartic_entropy_decode"));
    std::vector<int64_t> groups;
    int64_t total = 0;
    OP_REQUIRES_OK(ctx, ReadGroups(ctx->input(1), "quartic_entropy_decode", &groups, &total));
    const int64_t n = input.NumElements();
    // The receiver's layout fixes the output size; the header must at least fit.
    OP_REQUIRES(ctx, n >= qr::kHeaderBytesPerGroup * static_cast<int64_t>(groups.size()) +
                              qr::kStateBytes,
                errors::InvalidArgument("quartic_entropy_decode: ", n, " bytes cannot hold the ",
                                        "header of ", groups.size(), " groups"));
    Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({total}), &output));
    const char* error = qr::Decode(input.flat<uint8>().data(), n, groups.data(), groups.size(),
                                   output->flat<uint8>().data());
    OP_REQUIRES(ctx, error == nullptr,
                errors::InvalidArgument("quartic_entropy_decode: not an encoding of groups of ",
                                        "these sizes: ", error == nullptr ? "" : error));
  }
};

REGISTER_KERNEL_BUILDER(Name("Tfgc>QuarticEntropyEncode").Device(DEVICE_CPU),
                        QuarticEntropyEncodeOp);
REGISTER_KERNEL_BUILDER(Name("Tfgc>QuarticEntropyDecode").Device(DEVICE_CPU),
                        QuarticEntropyDecodeOp);

}  // namespace tfgc_ops
}  // namespace tensorflow
