// libFuzzer target: ChunkedTopK's chunked selection and its decoder (chunk_top_k.h).
//
// Input: bytes 0..1 are the chunk (2 + value % 300), bytes 2..3 `kept` (1 + value %
// chunk); bit 0 of byte 4 picks the half:
//   0: the rest is float32 values (cut to whole floats). Encode them into exactly sized
//      heap buffers (ASan catches writes past them), in blocks of 8 chunks as the op
//      does; the positions must pass FindInvalidChunk; the decoding keeps, per finite
//      chunk, KeptIn(length) entries at most, each the sign of its value, every kept
//      magnitude at least every dropped one, the levels low <= high.
//   1: the rest is n (2 bytes) and then bytes taken as the positions stream and the codes
//      (cut or zero-filled to the sizes n values take, in exactly sized buffers):
//      FindInvalidChunk reads only the stream, and where it passes, Decode writes only
//      out[0, n) and every position it writes lies within its chunk.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "chunk_top_k.h"
#include "fuzz_check.h"

using tfgc_fuzz::Check;
namespace ct = ::tfgc::chunk_top_k;

namespace {

template <typename T>
std::unique_ptr<T[]> Exact(int64_t n) {
  return std::unique_ptr<T[]>(new T[std::max<int64_t>(n, 1)]);
}

void EncodeHalf(const ct::Layout& layout, const uint8_t* data, size_t size) {
  const int64_t n = static_cast<int64_t>(size) / 4;
  std::vector<float> x(n);
  if (n > 0) std::memcpy(x.data(), data, 4 * n);
  const int64_t total = ct::TotalKept(layout, n), chunks = ct::NumChunks(layout, n);
  Check(total <= n, "no more entries than values");
  const int bits = ct::IndexBits(layout);
  const int64_t position_bytes = ct::PackedBytes(total, bits);
  const int64_t code_bytes = ct::PackedBytes(total, ct::kCodeBits);
  auto positions = Exact<uint8_t>(position_bytes);
  auto codes = Exact<uint8_t>(code_bytes);
  auto levels = Exact<float>(2 * chunks);
  std::vector<uint32_t> scratch;
  for (int64_t first = 0; first < chunks; first += 8) {
    ct::Encode(x.data(), n, layout, first, std::min(chunks, first + 8), positions.get(),
               codes.get(), levels.get(), &scratch);
  }
  Check(ct::FindInvalidChunk(positions.get(), n, layout) < 0, "own positions pass");
  auto out = Exact<float>(n);
  for (int64_t first = 0; first < chunks; first += 8) {
    ct::Decode(positions.get(), codes.get(), levels.get(), n, layout, first,
               std::min(chunks, first + 8), out.get());
  }
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t start = c * layout.chunk, length = std::min(layout.chunk, n - start);
    bool finite = true;
    for (int64_t i = 0; i < length; ++i) finite = finite && std::isfinite(x[start + i]);
    if (!finite) {
      Check(std::isnan(levels[2 * c]) && std::isnan(levels[2 * c + 1]), "NaN levels");
      continue;
    }
    Check(levels[2 * c] <= levels[2 * c + 1], "low <= high");
    int64_t sent = 0;
    float smallest_sent = INFINITY, largest_dropped = 0;
    for (int64_t i = 0; i < length; ++i) {
      const float v = x[start + i], d = out[start + i];
      if (d != 0) {
        ++sent;
        Check(v != 0 && std::signbit(v) == std::signbit(d), "a sent value keeps its sign");
        smallest_sent = std::min(smallest_sent, std::fabs(v));
      } else if (levels[2 * c] != 0 || v == 0) {
        largest_dropped = std::max(largest_dropped, std::fabs(v));
      }
    }
    Check(sent <= ct::KeptIn(layout, length), "at most KeptIn entries");
    Check(sent == 0 || smallest_sent >= largest_dropped, "the largest magnitudes are kept");
  }
}

void DecodeHalf(const ct::Layout& layout, const uint8_t* data, size_t size) {
  if (size < 2) return;
  const int64_t n = data[0] | data[1] << 8;
  data += 2, size -= 2;
  const int64_t total = ct::TotalKept(layout, n), chunks = ct::NumChunks(layout, n);
  const int64_t position_bytes = ct::PackedBytes(total, ct::IndexBits(layout));
  const int64_t code_bytes = ct::PackedBytes(total, ct::kCodeBits);
  auto positions = Exact<uint8_t>(position_bytes);
  auto codes = Exact<uint8_t>(code_bytes);
  for (int64_t i = 0; i < position_bytes; ++i) {
    positions[i] = i < static_cast<int64_t>(size) ? data[i] : 0;
  }
  for (int64_t i = 0; i < code_bytes; ++i) codes[i] = static_cast<uint8_t>(i * 37);
  if (ct::FindInvalidChunk(positions.get(), n, layout) >= 0) return;
  auto levels = Exact<float>(2 * chunks);
  for (int64_t c = 0; c < 2 * chunks; ++c) levels[c] = 1.0f + c % 2;
  auto out = Exact<float>(n);
  for (int64_t first = 0; first < chunks; first += 8) {
    ct::Decode(positions.get(), codes.get(), levels.get(), n, layout, first,
               std::min(chunks, first + 8), out.get());
  }
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t start = c * layout.chunk, length = std::min(layout.chunk, n - start);
    int64_t written = 0;
    for (int64_t i = 0; i < length; ++i) written += out[start + i] != 0;
    Check(written == ct::KeptIn(layout, length), "one value per entry, within the chunk");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 5) return 0;
  ct::Layout layout;
  layout.chunk = 2 + (data[0] | data[1] << 8) % 300;
  layout.kept = 1 + (data[2] | data[3] << 8) % layout.chunk;
  Check(ct::Valid(layout), "layout");
  if (data[4] & 1) {
    DecodeHalf(layout, data + 5, size - 5);
  } else {
    EncodeHalf(layout, data + 5, size - 5);
  }
  return 0;
}
