// TensorFlow ops around stochastic_rounding.h: QSGD's codes and 3LC's stochastic
// 3-values, each one pass of C++ instead of a random draw per value and elementwise ops.
#include <cstring>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "bit_packing.h"
#include "op_util.h"
#include "quartic_fold.h"
#include "stochastic_rounding.h"

namespace tensorflow {
namespace tfgc_ops {
namespace {

namespace sr = ::tfgc::stochastic_rounding;

// Values per block of work (a multiple of 8: blocks pack into whole bytes).
constexpr int64_t kValuesPerBlock = 256 * 1024;

absl::Status CheckSeed(const Tensor& seed, const char* op) {
  if (!TensorShapeUtils::IsVector(seed.shape()) || seed.NumElements() != 2) {
    return errors::InvalidArgument(op, ": seed must be 2 int64 values, got shape ",
                                   seed.shape().DebugString());
  }
  return absl::OkStatus();
}

absl::Status CheckQsgdSettings(int64_t bucket, int bits, const char* op) {
  if (bucket < 1) return errors::InvalidArgument(op, ": bucket_size must be >= 1, got ", bucket);
  if (bits < 2 || bits > 8) return errors::InvalidArgument(op, ": bits must be in [2, 8], got ", bits);
  return absl::OkStatus();
}

int64_t BucketsFor(int64_t n, int64_t bucket) { return n / bucket + (n % bucket != 0); }

}  // namespace

REGISTER_OP("Tfgc>QsgdNorms")
    .Input("x: float")
    .Attr("bucket_size: int")
    .Output("norms: float")
    .SetShapeFn(VectorInOut)
    .Doc(R"doc(
L2 norm of each bucket of bucket_size values of 1-D x (the last one short), summed in
double; NaN or Inf where a value is not finite.
)doc");

REGISTER_OP("Tfgc>QsgdEncode")
    .Input("x: float")
    .Input("norms: float")
    .Input("seed: int64")
    .Attr("bits: int")
    .Attr("bucket_size: int")
    .Output("packed: uint8")
    .SetShapeFn(VectorInOut)
    .Doc(R"doc(
QSGD's stochastic rounding of 1-D x against its bucket norms, codes packed bits each.

norms: one per bucket of bucket_size values (what the receiver will read).
seed: 2 int64 values; the draws depend on them and the value's index only.
packed: ceil(n * bits / 8) bytes of sign-level codes (see stochastic_rounding.h).
)doc");

REGISTER_OP("Tfgc>QsgdDecode")
    .Input("packed: uint8")
    .Input("norms: float")
    .Input("n: int64")
    .Attr("bits: int")
    .Attr("bucket_size: int")
    .Output("values: float")
    .SetShapeFn(UnknownVectorOut)
    .Doc(R"doc(
Inverse of QsgdEncode: the n values (+-level * norm) / levels. packed must hold exactly
ceil(n * bits / 8) bytes and norms one value per bucket.
)doc");

REGISTER_OP("Tfgc>StochasticTernaryFold")
    .Input("x: float")
    .Input("scale: float")
    .Input("seed: int64")
    .Output("quartic: uint8")
    .SetShapeFn(VectorInOut)
    .Doc(R"doc(
3LC's stochastic 3-values folded five per byte: q = sign(x) with probability |x| / scale,
else 0; all 0 when scale is not > 0. Bytes as QuarticFold writes them.
)doc");

class QsgdNormsOp : public OpKernel {
 public:
  explicit QsgdNormsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("bucket_size", &bucket_));
    OP_REQUIRES_OK(ctx, CheckQsgdSettings(bucket_, 2, "qsgd_norms"));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x = ctx->input(0);
    OP_REQUIRES_OK(ctx, CheckVector(x, "qsgd_norms"));
    const int64_t n = x.NumElements();
    const int64_t buckets = BucketsFor(n, bucket_);
    Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({buckets}), &output));
    const float* in = x.flat<float>().data();
    float* norms = output->flat<float>().data();
    const int64_t per_block = std::max<int64_t>(1, kValuesPerBlock / bucket_);
    const int64_t bucket = bucket_;
    ForEachBlock(ctx, BucketsFor(buckets, per_block), 4 * per_block * bucket, [=](int64_t b) {
      sr::BucketNorms(in, n, bucket, b * per_block, std::min(buckets, (b + 1) * per_block), norms);
    });
  }

 private:
  int64_t bucket_;
};

// QsgdEncode and QsgdDecode: their attributes, checked once, and the norms check.
class QsgdKernel : public OpKernel {
 public:
  QsgdKernel(OpKernelConstruction* ctx, const char* op) : OpKernel(ctx), op_(op) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("bits", &bits_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("bucket_size", &bucket_));
    OP_REQUIRES_OK(ctx, CheckQsgdSettings(bucket_, bits_, op));
  }

 protected:
  // OK if `norms` holds one value per bucket of n values.
  absl::Status CheckNorms(const Tensor& norms, int64_t n) const {
    if (norms.NumElements() == BucketsFor(n, bucket_)) return absl::OkStatus();
    return errors::InvalidArgument(op_, ": ", n, " values in buckets of ", bucket_, " need ",
                                   BucketsFor(n, bucket_), " norms, got ", norms.NumElements());
  }

  const char* op_;
  int bits_;
  int64_t bucket_;
};

class QsgdEncodeOp : public QsgdKernel {
 public:
  explicit QsgdEncodeOp(OpKernelConstruction* ctx) : QsgdKernel(ctx, "qsgd_encode") {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x = ctx->input(0);
    const Tensor& norms = ctx->input(1);
    const Tensor& seed = ctx->input(2);
    OP_REQUIRES_OK(ctx, CheckVector(x, "qsgd_encode"));
    OP_REQUIRES_OK(ctx, CheckVector(norms, "qsgd_encode"));
    OP_REQUIRES_OK(ctx, CheckSeed(seed, "qsgd_encode"));
    const int64_t n = x.NumElements();
    OP_REQUIRES_OK(ctx, CheckNorms(norms, n));
    Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
        0, TensorShape({::tfgc::bit_packing::PackedSize(n, bits_)}), &output));
    const float* in = x.flat<float>().data();
    const float* norm = norms.flat<float>().data();
    const uint64_t s0 = static_cast<uint64_t>(seed.flat<int64_t>()(0));
    const uint64_t s1 = static_cast<uint64_t>(seed.flat<int64_t>()(1));
    uint8_t* out = output->flat<uint8>().data();
    const int64_t bucket = bucket_;
    const int bits = bits_;
    ForEachBlock(ctx, BucketsFor(n, kValuesPerBlock), 8 * kValuesPerBlock, [=](int64_t b) {
      sr::QsgdEncode(in, n, norm, bucket, bits, s0, s1, b * kValuesPerBlock,
                     std::min(n, (b + 1) * kValuesPerBlock), out);
    });
  }
};

class QsgdDecodeOp : public QsgdKernel {
 public:
  explicit QsgdDecodeOp(OpKernelConstruction* ctx) : QsgdKernel(ctx, "qsgd_decode") {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& packed = ctx->input(0);
    const Tensor& norms = ctx->input(1);
    const Tensor& count = ctx->input(2);
    OP_REQUIRES_OK(ctx, CheckVector(packed, "qsgd_decode"));
    OP_REQUIRES_OK(ctx, CheckVector(norms, "qsgd_decode"));
    OP_REQUIRES_OK(ctx, CheckScalar(count, "qsgd_decode", "n"));
    const int64_t n = count.scalar<int64_t>()();
    OP_REQUIRES_OK(ctx, CheckPackedCount(packed.NumElements(), n, bits_, "qsgd_decode"));
    OP_REQUIRES_OK(ctx, CheckNorms(norms, n));
    Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n}), &output));
    const uint8_t* in = packed.flat<uint8>().data();
    const float* norm = norms.flat<float>().data();
    float* out = output->flat<float>().data();
    const int64_t bucket = bucket_;
    const int bits = bits_;
    ForEachBlock(ctx, BucketsFor(n, kValuesPerBlock), 8 * kValuesPerBlock, [=](int64_t b) {
      sr::QsgdDecode(in, n, norm, bucket, bits, b * kValuesPerBlock,
                     std::min(n, (b + 1) * kValuesPerBlock), out);
    });
  }
};

class StochasticTernaryFoldOp : public OpKernel {
 public:
  explicit StochasticTernaryFoldOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x = ctx->input(0);
    const Tensor& seed = ctx->input(2);
    OP_REQUIRES_OK(ctx, CheckVector(x, "stochastic_ternary_fold"));
    OP_REQUIRES_OK(ctx, CheckScalar(ctx->input(1), "stochastic_ternary_fold", "scale"));
    OP_REQUIRES_OK(ctx, CheckSeed(seed, "stochastic_ternary_fold"));
    const float scale = ctx->input(1).scalar<float>()();
    const int64_t n = x.NumElements();
    const int64_t groups = ::tfgc::quartic_fold::GroupsFor(n);
    Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({groups}), &output));
    uint8_t* out = output->flat<uint8>().data();
    if (!(scale > 0)) {  // zero or NaN: every 3-value is 0
      std::memset(out, 121, groups);
      return;
    }
    const float* in = x.flat<float>().data();
    const uint64_t s0 = static_cast<uint64_t>(seed.flat<int64_t>()(0));
    const uint64_t s1 = static_cast<uint64_t>(seed.flat<int64_t>()(1));
    const int64_t per_block = kValuesPerBlock / 5;
    ForEachBlock(ctx, BucketsFor(groups, per_block), 5 * 8 * per_block, [=](int64_t b) {
      sr::TernaryFold(in, n, scale, s0, s1, b * per_block, std::min(groups, (b + 1) * per_block),
                      out);
    });
  }
};

REGISTER_KERNEL_BUILDER(Name("Tfgc>QsgdNorms").Device(DEVICE_CPU), QsgdNormsOp);
REGISTER_KERNEL_BUILDER(Name("Tfgc>QsgdEncode").Device(DEVICE_CPU), QsgdEncodeOp);
REGISTER_KERNEL_BUILDER(Name("Tfgc>QsgdDecode").Device(DEVICE_CPU), QsgdDecodeOp);
REGISTER_KERNEL_BUILDER(Name("Tfgc>StochasticTernaryFold").Device(DEVICE_CPU),
                        StochasticTernaryFoldOp);

}  // namespace tfgc_ops
}  // namespace tensorflow
