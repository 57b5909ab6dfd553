// TensorFlow ops around the key packing in key_packing.h.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "key_packing.h"
#include "op_util.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tensorflow {
namespace tfgc_ops {
namespace {

namespace kp = ::tfgc::key_packing;

// Fixed blocks keep the work split, and so the output, independent of the thread count.
constexpr int64_t kBlockKeys = 64 * 1024;

}  // namespace

REGISTER_OP("Tfgc>PackKeys")
    .Input("keys: T")
    .Output("packed: uint8")
    .Attr("T: {int32, int64}")
    .Attr("flag_bits: int = 2")
    .SetShapeFn(VectorInOut)
    .Doc(R"doc(
Delta + adaptive bit-level binary encoding of sparse keys (FastSGD Algorithm 2).

keys: 1-D, non-negative and strictly increasing.
packed: self-describing bytes (flag bits, delta bit length, count, bit stream).
flag_bits: bits of the length flag, 1..5.
)doc");

REGISTER_OP("Tfgc>UnpackKeys")
    .Input("packed: uint8")
    .Output("keys: int64")
    .SetShapeFn(VectorInOut)
    .Doc(R"doc(
Inverse of PackKeys. Malformed input is an InvalidArgument error.
)doc");

template <typename T>
class PackKeysOp : public OpKernel {
 public:
  explicit PackKeysOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("flag_bits", &flag_bits_));
    OP_REQUIRES(ctx, flag_bits_ >= kp::kMinFlagBits && flag_bits_ <= kp::kMaxFlagBits,
                errors::InvalidArgument("pack_keys: flag_bits must be in [1, 5], got ",
                                        flag_bits_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& input = ctx->input(0);
    OP_REQUIRES(ctx, TensorShapeUtils::IsVector(input.shape()),
                errors::InvalidArgument("pack_keys expects 1-D keys, got shape ",
                                        input.shape().DebugString()));
    const int64_t n = input.NumElements();
    const T* raw = input.flat<T>().data();
    std::vector<int64_t> widened;
    const int64_t* keys = Widen(raw, n, &widened);

    const int64_t num_blocks = (n + kBlockKeys - 1) / kBlockKeys;
    auto begin_of = [n](int64_t b) { return std::min(n, b * kBlockKeys); };
    auto previous_of = [keys, &begin_of](int64_t b) {
      return b == 0 ? int64_t{-1} : keys[begin_of(b) - 1];
    };

    // Pass 1: validate and find the largest delta.
    std::vector<std::string> errors(num_blocks);
    std::vector<uint64_t> max_delta(num_blocks, 0);
    ForEachBlock(ctx, num_blocks, 2 * kBlockKeys, [&](int64_t b) {
      const int64_t begin = begin_of(b), len = begin_of(b + 1) - begin;
      errors[b] = kp::CheckKeys(keys + begin, len, previous_of(b), begin);
      if (errors[b].empty()) max_delta[b] = kp::MaxDelta(keys + begin, len, previous_of(b));
    });
    for (const std::string& error : errors) {
      OP_REQUIRES(ctx, error.empty(), errors::InvalidArgument("pack_keys: ", error));
    }
    const uint64_t largest =
        num_blocks ? *std::max_element(max_delta.begin(), max_delta.end()) : 0;
    const kp::CodeBook book(kp::BitLength(largest), flag_bits_);

    // Pass 2: bits per block, then their offsets in the stream.
    std::vector<int64_t> bit_offset(num_blocks + 1, 0);
    ForEachBlock(ctx, num_blocks, 4 * kBlockKeys, [&](int64_t b) {
      const int64_t begin = begin_of(b);
      bit_offset[b + 1] =
          kp::StreamBits(book, keys + begin, begin_of(b + 1) - begin, previous_of(b));
    });
    for (int64_t b = 0; b < num_blocks; ++b) bit_offset[b + 1] += bit_offset[b];

    const std::vector<uint8_t> header = kp::Header(flag_bits_, book.max_bits, n);
    const int64_t header_size = static_cast<int64_t>(header.size());
    const int64_t stream_bytes = (bit_offset[num_blocks] + 7) / 8;
    Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx,
                   ctx->allocate_output(0, TensorShape({header_size + stream_bytes}), &output));
    uint8_t* out = output->flat<uint8>().data();
    std::memcpy(out, header.data(), header_size);
    uint8_t* stream = out + header_size;
    std::memset(stream, 0, stream_bytes);

    // Pass 3: each block writes its bits into its own buffer (blocks may share a byte at
    // their boundary), then the buffers are merged in order.
    std::vector<std::vector<uint8_t>> parts(num_blocks);
    ForEachBlock(ctx, num_blocks, 8 * kBlockKeys, [&](int64_t b) {
      const int64_t begin = begin_of(b);
      const int first_bit = static_cast<int>(bit_offset[b] % 8);
      parts[b].assign((first_bit + bit_offset[b + 1] - bit_offset[b] + 7) / 8, 0);
      kp::WriteStream(book, keys + begin, begin_of(b + 1) - begin, previous_of(b), first_bit,
                      parts[b].data());
    });
    for (int64_t b = 0; b < num_blocks; ++b) {
      if (parts[b].empty()) continue;
      uint8_t* dst = stream + bit_offset[b] / 8;
      dst[0] |= parts[b][0];
      std::memcpy(dst + 1, parts[b].data() + 1, parts[b].size() - 1);
    }
  }

 private:
  static const int64_t* Widen(const int64_t* keys, int64_t, std::vector<int64_t>*) {
    return keys;
  }
  static const int64_t* Widen(const int32* keys, int64_t n, std::vector<int64_t>* widened) {
    widened->assign(keys, keys + n);
    return widened->data();
  }

  int flag_bits_;
};

class UnpackKeysOp : public OpKernel {
 public:
  explicit UnpackKeysOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  // Sequential: entry boundaries are only known by reading the flags before them.
  void Compute(OpKernelContext* ctx) override {
    const Tensor& input = ctx->input(0);
    OP_REQUIRES(ctx, TensorShapeUtils::IsVector(input.shape()),
                errors::InvalidArgument("unpack_keys expects 1-D uint8, got shape ",
                                        input.shape().DebugString()));
    const uint8_t* packed = input.flat<uint8>().data();
    const int64_t size = input.NumElements();
    int flag_bits, max_bits;
    int64_t count, header_size;
    std::string error;
    OP_REQUIRES(ctx,
                kp::ParseHeader(packed, size, &flag_bits, &max_bits, &count, &header_size,
                                &error),
                errors::InvalidArgument("unpack_keys: ", error));
    Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({count}), &output));
    OP_REQUIRES(ctx, kp::UnpackInto(packed, size, output->flat<int64_t>().data(), &error),
                errors::InvalidArgument("unpack_keys: ", error));
  }
};

REGISTER_KERNEL_BUILDER(
    Name("Tfgc>PackKeys").Device(DEVICE_CPU).TypeConstraint<int32>("T"), PackKeysOp<int32>);
REGISTER_KERNEL_BUILDER(
    Name("Tfgc>PackKeys").Device(DEVICE_CPU).TypeConstraint<int64_t>("T"), PackKeysOp<int64_t>);
REGISTER_KERNEL_BUILDER(Name("Tfgc>UnpackKeys").Device(DEVICE_CPU), UnpackKeysOp);

}  // namespace tfgc_ops
}  // namespace tensorflow
