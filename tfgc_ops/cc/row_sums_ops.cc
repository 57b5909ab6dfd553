// TensorFlow op around row_sums.h: a sparse gradient's rows summed by distinct index.
#include <algorithm>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "op_util.h"
#include "row_sums.h"

namespace tensorflow {
namespace tfgc_ops {

namespace rs = ::tfgc::row_sums;

REGISTER_OP("Tfgc>RowSums")
    .Input("rows: T")
    .Input("indices: Tindices")
    .Input("num_rows: int64")
    .Attr("T: {float, double}")
    .Attr("Tindices: {int32, int64}")
    .Output("distinct: int64")
    .Output("sums: T")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      shape_inference::ShapeHandle rows, indices;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &rows));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &indices));
      c->set_output(0, c->Vector(c->UnknownDim()));
      c->set_output(1, c->Matrix(c->UnknownDim(), c->Dim(rows, 1)));
      return absl::OkStatus();
    })
    .Doc(R"doc(
The rows of a sparse gradient summed by distinct index, in ascending index order.

rows: [n, row_size]; indices: [n], each in [0, num_rows).
distinct: the distinct indices, ascending.
sums: [len(distinct), row_size]; row k is the sum, in position order, of the rows whose
  index is distinct[k].
)doc");

template <typename T, typename Index>
class RowSumsOp : public OpKernel {
 public:
  explicit RowSumsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& rows = ctx->input(0);
    const Tensor& indices = ctx->input(1);
    OP_REQUIRES(ctx, TensorShapeUtils::IsMatrix(rows.shape()),
                errors::InvalidArgument("row_sums: rows must be 2-D, got shape ",
                                        rows.shape().DebugString()));
    OP_REQUIRES_OK(ctx, CheckVector(indices, "row_sums"));
    OP_REQUIRES_OK(ctx, CheckScalar(ctx->input(2), "row_sums", "num_rows"));
    const int64_t n = indices.NumElements();
    OP_REQUIRES(ctx, rows.dim_size(0) == n,
                errors::InvalidArgument("row_sums: ", rows.dim_size(0), " rows but ", n,
                                        " indices"));
    const int64_t num_rows = ctx->input(2).scalar<int64_t>()();
    OP_REQUIRES(ctx, num_rows >= 0,
                errors::InvalidArgument("row_sums: num_rows must be >= 0, got ", num_rows));
    const Index* in = indices.flat<Index>().data();
    const rs::RangeCheck check = rs::CheckRange(in, n, num_rows);
    const int64_t bad = check.first_out_of_range;
    OP_REQUIRES(ctx, bad < 0,
                errors::InvalidArgument("row_sums: indices[", bad, "] = ", bad < 0 ? 0 : in[bad],
                                        " is not in [0, ", num_rows, ")"));

    const rs::DistinctIndices<Index> distinct(in, n, num_rows, check);
    const int64_t u = distinct.size();
    const int64_t row_size = rows.dim_size(1);
    Tensor *distinct_out = nullptr, *sums = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({u}), &distinct_out));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({u, row_size}), &sums));
    distinct.CopyAscending(distinct_out->flat<int64_t>().data());
    T* out = sums->flat<T>().data();
    std::fill(out, out + u * row_size, T(0));
    distinct.AddRows(rows.flat<T>().data(), row_size, out);
  }
};

#define TFGC_REGISTER_ROW_SUMS(T, Index)                              \
  REGISTER_KERNEL_BUILDER(Name("Tfgc>RowSums")                        \
                              .Device(DEVICE_CPU)                     \
                              .TypeConstraint<T>("T")                 \
                              .TypeConstraint<Index>("Tindices"),     \
                          RowSumsOp<T, Index>)
TFGC_REGISTER_ROW_SUMS(float, int32_t);
TFGC_REGISTER_ROW_SUMS(float, int64_t);
TFGC_REGISTER_ROW_SUMS(double, int32_t);
TFGC_REGISTER_ROW_SUMS(double, int64_t);
#undef TFGC_REGISTER_ROW_SUMS

}  // namespace tfgc_ops
}  // namespace tensorflow
