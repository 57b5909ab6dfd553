// TensorFlow ops around chunk_top_k.h: ChunkedTopK's encode (per-chunk top-k selection,
// positions and 2-bit codes) and its decode.
#include <cstdint>
#include <limits>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "chunk_top_k.h"
#include "op_util.h"

namespace tensorflow {
namespace tfgc_ops {

namespace ct = ::tfgc::chunk_top_k;

namespace {

// Chunks per parallel block: 8 chunks' entries fill whole bytes of both streams.
constexpr int64_t kChunksPerBlock = 8;

absl::Status ReadLayout(OpKernelConstruction* ctx, ct::Layout* layout) {
  TF_RETURN_IF_ERROR(ctx->GetAttr("chunk", &layout->chunk));
  TF_RETURN_IF_ERROR(ctx->GetAttr("kept", &layout->kept));
  if (!ct::Valid(*layout)) {
    return errors::InvalidArgument("chunk_top_k: chunk must be in [", ct::kMinChunk, ", ",
                                   ct::kMaxChunk, "] and kept in [1, chunk], got chunk=",
                                   layout->chunk, " kept=", layout->kept);
  }
  return absl::OkStatus();
}

}  // namespace

REGISTER_OP("Tfgc>ChunkTopKEncode")
    .Input("x: float")
    .Attr("chunk: int")
    .Attr("kept: int")
    .Output("positions: uint8")
    .Output("codes: uint8")
    .Output("levels: float")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      shape_inference::ShapeHandle input;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &input));
      for (int i = 0; i < 3; ++i) c->set_output(i, c->Vector(c->UnknownDim()));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Chunked top-k with 2-bit values (ChunkedTopK's encode): x in chunks of `chunk` values,
each keeping ceil(length * kept / chunk) of its largest magnitudes, sent as positions
within the chunk (ceil(log2(chunk)) bits each) and 2-bit codes (sign, and which of the
chunk's two magnitude levels), both packed most significant bit first; levels holds
(low, high) per chunk.
)doc");

class ChunkTopKEncodeOp : public OpKernel {
 public:
  explicit ChunkTopKEncodeOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadLayout(ctx, &layout_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x = ctx->input(0);
    OP_REQUIRES_OK(ctx, CheckVector(x, "chunk_top_k_encode"));
    const int64_t n = x.NumElements();
    OP_REQUIRES(ctx, n <= std::numeric_limits<int32_t>::max(),
                errors::InvalidArgument("chunk_top_k_encode: at most 2^31 - 1 values, got ", n));
    const int64_t total = ct::TotalKept(layout_, n);
    const int64_t chunks = ct::NumChunks(layout_, n);
    Tensor *positions = nullptr, *codes = nullptr, *levels = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
        0, TensorShape({ct::PackedBytes(total, ct::IndexBits(layout_))}), &positions));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
        1, TensorShape({ct::PackedBytes(total, ct::kCodeBits)}), &codes));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({2 * chunks}), &levels));
    const float* in = x.flat<float>().data();
    uint8_t* position_bytes = positions->flat<uint8>().data();
    uint8_t* code_bytes = codes->flat<uint8>().data();
    float* level_values = levels->flat<float>().data();
    const ct::Layout layout = layout_;
    const int64_t blocks = (chunks + kChunksPerBlock - 1) / kChunksPerBlock;
    ForEachBlock(ctx, blocks, kChunksPerBlock * layout.chunk * 40, [&](int64_t b) {
      std::vector<uint32_t> scratch;
      ct::Encode(in, n, layout, b * kChunksPerBlock,
                 std::min(chunks, (b + 1) * kChunksPerBlock), position_bytes, code_bytes,
                 level_values, &scratch);
    });
  }

 private:
  ct::Layout layout_;
};

REGISTER_KERNEL_BUILDER(Name("Tfgc>ChunkTopKEncode").Device(DEVICE_CPU), ChunkTopKEncodeOp);

REGISTER_OP("Tfgc>ChunkTopKDecode")
    .Input("positions: uint8")
    .Input("codes: uint8")
    .Input("levels: float")
    .Input("n: int64")
    .Attr("chunk: int")
    .Attr("kept: int")
    .Output("dense: float")
    .SetShapeFn(UnknownVectorOut)
    .Doc(R"doc(
The inverse of chunk_top_k_encode: dense[n], sign * level at each entry's position and 0
elsewhere. InvalidArgument, before anything is allocated, when a stream's bytes or the
levels do not match n, or a chunk's positions do not ascend strictly within it.
)doc");

class ChunkTopKDecodeOp : public OpKernel {
 public:
  explicit ChunkTopKDecodeOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadLayout(ctx, &layout_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& positions = ctx->input(0);
    const Tensor& codes = ctx->input(1);
    const Tensor& levels = ctx->input(2);
    for (const Tensor* t : {&positions, &codes, &levels}) {
      OP_REQUIRES_OK(ctx, CheckVector(*t, "chunk_top_k_decode"));
    }
    OP_REQUIRES_OK(ctx, CheckScalar(ctx->input(3), "chunk_top_k_decode", "n"));
    const int64_t n = ctx->input(3).scalar<int64_t>()();
    OP_REQUIRES(ctx, n >= 0 && n <= std::numeric_limits<int32_t>::max(),
                errors::InvalidArgument("chunk_top_k_decode: n must be in [0, 2^31 - 1], got ",
                                        n));
    const int64_t total = ct::TotalKept(layout_, n);
    const int64_t chunks = ct::NumChunks(layout_, n);
    const int bits = ct::IndexBits(layout_);
    OP_REQUIRES(ctx, positions.NumElements() == ct::PackedBytes(total, bits),
                errors::InvalidArgument("chunk_top_k_decode: ", positions.NumElements(),
                                        " bytes of positions, expected ",
                                        ct::PackedBytes(total, bits), " for ", n, " values"));
    OP_REQUIRES(ctx, codes.NumElements() == ct::PackedBytes(total, ct::kCodeBits),
                errors::InvalidArgument("chunk_top_k_decode: ", codes.NumElements(),
                                        " bytes of codes, expected ",
                                        ct::PackedBytes(total, ct::kCodeBits), " for ", n,
                                        " values"));
    OP_REQUIRES(ctx, levels.NumElements() == 2 * chunks,
                errors::InvalidArgument("chunk_top_k_decode: ", levels.NumElements(),
                                        " levels, expected ", 2 * chunks, " for ", n,
                                        " values"));
    const uint8_t* position_bytes = positions.flat<uint8>().data();
    const int64_t invalid = ct::FindInvalidChunk(position_bytes, n, layout_);
    OP_REQUIRES(ctx, invalid < 0,
                errors::InvalidArgument("chunk_top_k_decode: the positions of chunk ", invalid,
                                        " do not ascend strictly within it"));
    Tensor* dense = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n}), &dense));
    const uint8_t* code_bytes = codes.flat<uint8>().data();
    const float* level_values = levels.flat<float>().data();
    float* out = dense->flat<float>().data();
    const ct::Layout layout = layout_;
    const int64_t blocks = (chunks + kChunksPerBlock - 1) / kChunksPerBlock;
    ForEachBlock(ctx, blocks, kChunksPerBlock * layout.chunk * 2, [&](int64_t b) {
      ct::Decode(position_bytes, code_bytes, level_values, n, layout, b * kChunksPerBlock,
                 std::min(chunks, (b + 1) * kChunksPerBlock), out);
    });
  }

 private:
  ct::Layout layout_;
};

REGISTER_KERNEL_BUILDER(Name("Tfgc>ChunkTopKDecode").Device(DEVICE_CPU), ChunkTopKDecodeOp);

}  // namespace tfgc_ops
}  // namespace tensorflow
