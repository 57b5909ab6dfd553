// TensorFlow ops around 3LC's quantization and folding in quartic_fold.h.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

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

// A tensor's range of groups (or values) in a batch of tensors laid end to end.
struct Piece {
  int64_t tensor, begin, end;
};

// The batch's tensors cut into pieces of at most `per_piece` of `count(size)` units.
template <typename Count>
std::vector<Piece> PiecesOf(const std::vector<int64_t>& sizes, int64_t per_piece, Count count) {
  std::vector<Piece> pieces;
  for (int64_t t = 0; t < static_cast<int64_t>(sizes.size()); ++t) {
    const int64_t units = count(sizes[t]);
    for (int64_t begin = 0; begin < units; begin += per_piece) {
      pieces.push_back({t, begin, std::min(units, begin + per_piece)});
    }
  }
  return pieces;
}

// OK if the batch's `sizes` are all >= 0, else InvalidArgument naming the op.
absl::Status CheckSizes(const std::vector<int64_t>& sizes, const char* op) {
  for (int64_t size : sizes) {
    if (size < 0) return errors::InvalidArgument(op, ": sizes must be >= 0, got ", size);
  }
  return absl::OkStatus();
}

// The starts of `sizes` laid end to end, and their total (the last entry).
std::vector<int64_t> Starts(const std::vector<int64_t>& sizes, int64_t (*count)(int64_t)) {
  std::vector<int64_t> starts(sizes.size() + 1, 0);
  for (size_t t = 0; t < sizes.size(); ++t) starts[t + 1] = starts[t] + count(sizes[t]);
  return starts;
}

int64_t Same(int64_t n) { return n; }

// OK if `scales` is a vector of one scale per tensor of the batch.
absl::Status CheckScales(const Tensor& scales, size_t tensors, const char* op) {
  if (!TensorShapeUtils::IsVector(scales.shape()) ||
      scales.NumElements() != static_cast<int64_t>(tensors)) {
    return errors::InvalidArgument(op, ": expects one scale per tensor (", tensors,
                                   "), got shape ", scales.shape().DebugString());
  }
  return absl::OkStatus();
}

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

REGISTER_OP("Tfgc>BatchLargestMagnitude")
    .Input("x: float")
    .Attr("sizes: list(int) >= 0")
    .Output("largest: float")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      std::vector<int64_t> sizes;
      TF_RETURN_IF_ERROR(c->GetAttr("sizes", &sizes));
      c->set_output(0, c->Vector(static_cast<int64_t>(sizes.size())));
      return absl::OkStatus();
    })
    .Doc(R"doc(
LargestMagnitude of each of a batch of tensors laid end to end in x (their sizes).
)doc");

REGISTER_OP("Tfgc>BatchQuarticFold")
    .Input("x: float")
    .Input("scales: float")
    .Attr("sizes: list(int) >= 0")
    .Output("quartic: uint8")
    .SetShapeFn(UnknownVectorOut)
    .Doc(R"doc(
QuarticFold of each of a batch of tensors laid end to end in x (their sizes), each with
its own scale; their quartic bytes laid end to end.
)doc");

REGISTER_OP("Tfgc>BatchQuarticUnfold")
    .Input("quartic: uint8")
    .Input("scales: float")
    .Attr("sizes: list(int) >= 0")
    .Output("values: float")
    .SetShapeFn(UnknownVectorOut)
    .Doc(R"doc(
Inverse of BatchQuarticFold: each tensor's values q * its scale, laid end to end.
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

// The batch ops check their input against the sizes (before anything is allocated) and
// work in pieces of at most one block, so large tensors still use every thread.
class BatchOp : public OpKernel {
 public:
  BatchOp(OpKernelConstruction* ctx, const char* name) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("sizes", &sizes_));
    OP_REQUIRES_OK(ctx, CheckSizes(sizes_, name));
  }

 protected:
  std::vector<int64_t> sizes_;  // the element counts of the batch's tensors
};

class BatchLargestMagnitudeOp : public BatchOp {
 public:
  explicit BatchLargestMagnitudeOp(OpKernelConstruction* ctx)
      : BatchOp(ctx, "batch_largest_magnitude") {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x = ctx->input(0);
    OP_REQUIRES_OK(ctx, CheckVector(x, "batch_largest_magnitude"));
    const std::vector<int64_t> starts = Starts(sizes_, Same);
    OP_REQUIRES(ctx, x.NumElements() == starts.back(),
                errors::InvalidArgument("batch_largest_magnitude: ", x.NumElements(),
                                        " values for sizes adding up to ", starts.back()));
    const std::vector<Piece> pieces = PiecesOf(sizes_, 5 * kGroupsPerBlock, Same);
    std::vector<float> largest(pieces.size());
    const float* in = x.flat<float>().data();
    ForEachBlock(ctx, pieces.size(), 4 * 5 * kGroupsPerBlock, [&](int64_t p) {
      const Piece& piece = pieces[p];
      largest[p] = qf::LargestMagnitude(in + starts[piece.tensor] + piece.begin,
                                        piece.end - piece.begin);
    });
    Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            0, TensorShape({static_cast<int64_t>(sizes_.size())}), &output));
    float* out = output->flat<float>().data();
    std::fill(out, out + sizes_.size(), 0.0f);
    for (size_t p = 0; p < pieces.size(); ++p) {
      float& to = out[pieces[p].tensor];
      // NaN (a value not finite) wins over every number.
      to = std::isnan(largest[p]) || std::isnan(to) ? NAN : std::max(to, largest[p]);
    }
  }
};

class BatchQuarticFoldOp : public BatchOp {
 public:
  explicit BatchQuarticFoldOp(OpKernelConstruction* ctx) : BatchOp(ctx, "batch_quartic_fold") {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x = ctx->input(0);
    OP_REQUIRES_OK(ctx, CheckVector(x, "batch_quartic_fold"));
    OP_REQUIRES_OK(ctx, CheckScales(ctx->input(1), sizes_.size(), "batch_quartic_fold"));
    const std::vector<int64_t> starts = Starts(sizes_, Same);
    OP_REQUIRES(ctx, x.NumElements() == starts.back(),
                errors::InvalidArgument("batch_quartic_fold: ", x.NumElements(),
                                        " values for sizes adding up to ", starts.back()));
    const std::vector<int64_t> group_starts = Starts(sizes_, qf::GroupsFor);
    Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({group_starts.back()}), &output));
    const float* in = x.flat<float>().data();
    const float* scales = ctx->input(1).flat<float>().data();
    uint8_t* out = output->flat<uint8>().data();
    const std::vector<Piece> pieces = PiecesOf(sizes_, kGroupsPerBlock, qf::GroupsFor);
    ForEachBlock(ctx, pieces.size(), 5 * 4 * kGroupsPerBlock, [&](int64_t p) {
      const Piece& piece = pieces[p];
      const float scale = scales[piece.tensor];
      uint8_t* to = out + group_starts[piece.tensor];
      if (!(scale > 0)) {  // zero or NaN: every 3-value is 0
        std::memset(to + piece.begin, 121, piece.end - piece.begin);
        return;
      }
      qf::Fold(in + starts[piece.tensor], sizes_[piece.tensor], scale, piece.begin, piece.end,
               to);
    });
  }
};

class BatchQuarticUnfoldOp : public BatchOp {
 public:
  explicit BatchQuarticUnfoldOp(OpKernelConstruction* ctx) : BatchOp(ctx, "batch_quartic_unfold") {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& quartic = ctx->input(0);
    OP_REQUIRES_OK(ctx, CheckVector(quartic, "batch_quartic_unfold"));
    OP_REQUIRES_OK(ctx, CheckScales(ctx->input(1), sizes_.size(), "batch_quartic_unfold"));
    const std::vector<int64_t> group_starts = Starts(sizes_, qf::GroupsFor);
    OP_REQUIRES(ctx, quartic.NumElements() == group_starts.back(),
                errors::InvalidArgument("batch_quartic_unfold: ", quartic.NumElements(),
                                        " bytes do not hold tensors of sizes taking ",
                                        group_starts.back(), " (ceil(n / 5) each)"));
    const uint8_t* in = quartic.flat<uint8>().data();
    OP_REQUIRES_OK(ctx, CheckQuartic(in, quartic.NumElements(), "batch_quartic_unfold"));
    const std::vector<int64_t> starts = Starts(sizes_, Same);
    Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({starts.back()}), &output));
    const float* scales = ctx->input(1).flat<float>().data();
    float* out = output->flat<float>().data();
    const std::vector<Piece> pieces = PiecesOf(sizes_, kGroupsPerBlock, qf::GroupsFor);
    ForEachBlock(ctx, pieces.size(), 5 * 4 * kGroupsPerBlock, [&](int64_t p) {
      const Piece& piece = pieces[p];
      qf::Unfold(in + group_starts[piece.tensor], sizes_[piece.tensor], scales[piece.tensor],
                 piece.begin, piece.end, out + starts[piece.tensor]);
    });
  }
};

REGISTER_KERNEL_BUILDER(Name("Tfgc>LargestMagnitude").Device(DEVICE_CPU), LargestMagnitudeOp);
REGISTER_KERNEL_BUILDER(Name("Tfgc>BatchLargestMagnitude").Device(DEVICE_CPU),
                        BatchLargestMagnitudeOp);
REGISTER_KERNEL_BUILDER(Name("Tfgc>BatchQuarticFold").Device(DEVICE_CPU), BatchQuarticFoldOp);
REGISTER_KERNEL_BUILDER(Name("Tfgc>BatchQuarticUnfold").Device(DEVICE_CPU),
                        BatchQuarticUnfoldOp);
REGISTER_KERNEL_BUILDER(Name("Tfgc>QuarticFold").Device(DEVICE_CPU), QuarticFoldOp);
REGISTER_KERNEL_BUILDER(Name("Tfgc>QuarticUnfold").Device(DEVICE_CPU), QuarticUnfoldOp);

}  // namespace tfgc_ops
}  // namespace tensorflow
