// TensorFlow ops around magnitude_select.h: the largest-magnitude selection (Sparsify's
// and TopK's encode in one op) and the expansion of a bitmap and values (Sparsify's
// decode).
#include <cstdint>
#include <limits>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "magnitude_select.h"
#include "op_util.h"

namespace tensorflow {
namespace tfgc_ops {

namespace ms = ::tfgc::magnitude_select;

REGISTER_OP("Tfgc>MagnitudeSelect")
    .Input("x: float")
    .Input("wanted: int64")
    .Attr("non_finite_in_wanted: bool = false")
    .Attr("positions_type: {uint8, int32}")
    .Output("positions: positions_type")
    .Output("values: float")
    .Output("reconstruction: float")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      shape_inference::ShapeHandle input, wanted;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &input));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 0, &wanted));
      c->set_output(0, c->Vector(shape_inference::InferenceContext::kUnknownDim));
      c->set_output(1, c->Vector(shape_inference::InferenceContext::kUnknownDim));
      c->set_output(2, input);
      return absl::OkStatus();
    })
    .Doc(R"doc(
Selects the `wanted` largest nonzero finite magnitudes of x, exactly (fewer when fewer
are nonzero), ties at the threshold in position order, plus every value that is not
finite (counted in `wanted` when non_finite_in_wanted). Three passes: a histogram of the
magnitudes' top bits, the chosen bin's candidates, and one pass that writes everything.

positions: uint8: a bitmap, bit i (most significant first, the last byte zero-padded) set
  for a selected value, as pack_bits packs 1-bit codes; int32: the selected positions,
  ascending.
values: the selected values in position order.
reconstruction: x where selected, 0 elsewhere (computed only where it is used).
)doc");

template <typename PositionType>
class MagnitudeSelectOp : public OpKernel {
 public:
  explicit MagnitudeSelectOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("non_finite_in_wanted", &non_finite_in_wanted_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x = ctx->input(0);
    OP_REQUIRES_OK(ctx, CheckVector(x, "magnitude_select"));
    OP_REQUIRES_OK(ctx, CheckScalar(ctx->input(1), "magnitude_select", "wanted"));
    const int64_t n = x.NumElements();
    // Counts are 32-bit (an L1-sized histogram) and positions int32.
    OP_REQUIRES(ctx, n <= std::numeric_limits<int32_t>::max(),
                errors::InvalidArgument("magnitude_select: at most 2^31 - 1 values, got ", n));
    const float* in = x.flat<float>().data();
    std::vector<uint32_t> scratch;
    const ms::Selection selection =
        ms::Select(in, n, ctx->input(1).scalar<int64_t>()(), non_finite_in_wanted_, &scratch);

    constexpr bool kBitmap = std::is_same<PositionType, uint8>::value;
    Tensor *positions = nullptr, *values = nullptr, *reconstruction = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({kBitmap ? (n + 7) / 8
                                                                       : selection.count}),
                                             &positions));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({selection.count}), &values));
    ms::Outputs outputs;
    if (kBitmap) {
      outputs.bitmap = reinterpret_cast<uint8_t*>(positions->flat<PositionType>().data());
    } else {
      outputs.positions = reinterpret_cast<int32_t*>(positions->flat<PositionType>().data());
    }
    outputs.values = values->flat<float>().data();
    if (ctx->output_required(2)) {
      OP_REQUIRES_OK(ctx, ctx->allocate_output(2, x.shape(), &reconstruction));
      outputs.reconstruction = reconstruction->flat<float>().data();
    }
    ms::Write(in, n, selection, outputs);
  }

 private:
  bool non_finite_in_wanted_ = false;
};

REGISTER_KERNEL_BUILDER(
    Name("Tfgc>MagnitudeSelect").Device(DEVICE_CPU).TypeConstraint<uint8>("positions_type"),
    MagnitudeSelectOp<uint8>);
REGISTER_KERNEL_BUILDER(
    Name("Tfgc>MagnitudeSelect").Device(DEVICE_CPU).TypeConstraint<int32>("positions_type"),
    MagnitudeSelectOp<int32>);

REGISTER_OP("Tfgc>BitmapExpand")
    .Input("bitmap: uint8")
    .Input("values: float")
    .Input("n: int64")
    .Output("dense: float")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      shape_inference::ShapeHandle bitmap, values, n;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &bitmap));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &values));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 0, &n));
      c->set_output(0, c->Vector(shape_inference::InferenceContext::kUnknownDim));
      return absl::OkStatus();
    })
    .Doc(R"doc(
The inverse of magnitude_select's bitmap and values (Sparsify's decode): dense[i] is the
next of `values` where bit i of `bitmap` is set (most significant bit first), else 0.
InvalidArgument, before anything is allocated, when the bitmap does not hold exactly
ceil(n / 8) bytes or its first n bits do not set exactly size(values) bits.
)doc");

class BitmapExpandOp : public OpKernel {
 public:
  explicit BitmapExpandOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& bitmap = ctx->input(0);
    const Tensor& values = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckVector(bitmap, "bitmap_expand"));
    OP_REQUIRES_OK(ctx, CheckVector(values, "bitmap_expand"));
    OP_REQUIRES_OK(ctx, CheckScalar(ctx->input(2), "bitmap_expand", "n"));
    const int64_t n = ctx->input(2).scalar<int64_t>()();
    // Checked without overflow: n comes from the payload.
    OP_REQUIRES_OK(ctx, CheckPackedCount(bitmap.NumElements(), n, 1, "bitmap_expand"));
    const uint8_t* bits = bitmap.flat<uint8>().data();
    const int64_t selected = ms::CountSelected(bits, n);
    OP_REQUIRES(ctx, selected == values.NumElements(),
                errors::InvalidArgument("bitmap_expand: the bitmap selects ", selected,
                                        " values, got ", values.NumElements()));
    Tensor* dense = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n}), &dense));
    ms::Expand(bits, n, values.flat<float>().data(), dense->flat<float>().data());
  }
};

REGISTER_KERNEL_BUILDER(Name("Tfgc>BitmapExpand").Device(DEVICE_CPU), BitmapExpandOp);

REGISTER_OP("Tfgc>PositionsExpand")
    .Input("positions: int32")
    .Input("values: float")
    .Input("n: int64")
    .Output("dense: float")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      shape_inference::ShapeHandle positions, values, n;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &positions));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &values));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 0, &n));
      c->set_output(0, c->Vector(shape_inference::InferenceContext::kUnknownDim));
      return absl::OkStatus();
    })
    .Doc(R"doc(
The inverse of magnitude_select's positions and values (TopK's decode): dense[positions[j]]
is values[j], every other value 0. InvalidArgument, before anything is allocated, when
there are not as many values as positions, n is negative, or the positions are not
strictly ascending within [0, n).
)doc");

class PositionsExpandOp : public OpKernel {
 public:
  explicit PositionsExpandOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& positions = ctx->input(0);
    const Tensor& values = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckVector(positions, "positions_expand"));
    OP_REQUIRES_OK(ctx, CheckVector(values, "positions_expand"));
    OP_REQUIRES_OK(ctx, CheckScalar(ctx->input(2), "positions_expand", "n"));
    const int64_t n = ctx->input(2).scalar<int64_t>()();
    const int64_t count = positions.NumElements();
    OP_REQUIRES(ctx, values.NumElements() == count,
                errors::InvalidArgument("positions_expand: ", count, " positions but ",
                                        values.NumElements(), " values"));
    OP_REQUIRES(ctx, n >= 0, errors::InvalidArgument("positions_expand: n is ", n));
    const int32_t* at = positions.flat<int32>().data();
    OP_REQUIRES(ctx, ms::PositionsAscendWithin(at, count, n),
                errors::InvalidArgument("positions_expand: positions are not strictly "
                                        "ascending within [0, ", n, ")"));
    Tensor* dense = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n}), &dense));
    ms::ExpandPositions(at, count, values.flat<float>().data(), n, dense->flat<float>().data());
  }
};

REGISTER_KERNEL_BUILDER(Name("Tfgc>PositionsExpand").Device(DEVICE_CPU), PositionsExpandOp);

}  // namespace tfgc_ops
}  // namespace tensorflow
