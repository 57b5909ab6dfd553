// Chunked top-k with 2-bit values (ChunkedTopK, SparseLoCo's pseudo-gradient codec), free
// of TensorFlow.
//
// x[0, n) is cut into chunks of `chunk` values (the last one shorter when chunk does not
// divide n). A chunk of `length` values keeps KeptIn(length) = ceil(length * kept / chunk)
// of them (`kept` for a whole chunk): its largest magnitudes, selected exactly by
// magnitude_select's Select (ties in position order). Each kept value is sent as its
// position within the chunk, IndexBits(chunk) = ceil(log2(chunk)) bits, and a 2-bit code:
// bit 1 its sign (1: negative), bit 0 which of the chunk's two magnitude levels it takes
// (1: `high`). The levels are a two-level Lloyd-Max quantizer of the kept magnitudes: each
// the mean of the magnitudes it stands for.
//
// Every chunk sends exactly KeptIn(length) entries, so the sizes depend on n alone:
//   positions: PackedBytes(TotalKept(n), IndexBits(chunk)) bytes, the entries of chunk 0
//              first, each chunk's positions strictly ascending;
//   codes:     PackedBytes(TotalKept(n), 2) bytes, in the same order;
//   levels:    2 * NumChunks(n) floats, (low, high) per chunk.
// Both streams are written most significant bit first, as bit_packing packs codes.
// A chunk with fewer nonzero values than it keeps sends all of them at level `high` and
// fills its entries with the first zeros' positions at level `low`, which is then 0 (a
// zero decodes to 0). A chunk holding a value that is not finite sends positions
// 0 .. KeptIn - 1 with NaN levels: its decoding is NaN there (a failed step stays visible).
#ifndef TFGC_OPS_CC_CHUNK_TOP_K_H_
#define TFGC_OPS_CC_CHUNK_TOP_K_H_

#include <cstdint>
#include <vector>

namespace tfgc {
namespace chunk_top_k {

inline constexpr int64_t kMinChunk = 2;
inline constexpr int64_t kMaxChunk = int64_t{1} << 16;  // positions of at most 16 bits
inline constexpr int kCodeBits = 2;

// The layout of one tensor: chunk in [kMinChunk, kMaxChunk], kept in [1, chunk].
struct Layout {
  int64_t chunk = 0;
  int64_t kept = 0;
};

// True when `layout` is one the functions below take.
bool Valid(const Layout& layout);

// ceil(log2(chunk)): bits of one position.
int IndexBits(const Layout& layout);

// Chunks of n >= 0 values: ceil(n / chunk).
int64_t NumChunks(const Layout& layout, int64_t n);

// Entries a chunk of `length` values (1 .. chunk) keeps: ceil(length * kept / chunk).
int64_t KeptIn(const Layout& layout, int64_t length);

// Entries of all the chunks of n >= 0 values (at most n).
int64_t TotalKept(const Layout& layout, int64_t n);

// Bytes that `count` codes of `bits` bits take: ceil(count * bits / 8).
inline int64_t PackedBytes(int64_t count, int bits) { return (count * bits + 7) / 8; }

// Encodes chunks [first, end) of x[0, n) into `positions`, `codes` (the whole streams
// of the tensor: each call writes only the bytes of its chunks, so calls over disjoint
// ranges whose `first` is a multiple of 8 may run at once) and `levels` (2 per chunk).
// `scratch` is the selection's work space (one per thread).
void Encode(const float* x, int64_t n, const Layout& layout, int64_t first, int64_t end,
            uint8_t* positions, uint8_t* codes, float* levels,
            std::vector<uint32_t>* scratch);

// Returns -1 when every chunk's positions in the stream of n values (exactly
// PackedBytes(TotalKept(n), IndexBits) bytes) ascend strictly within its length, else
// the first chunk whose do not. Reads nothing beyond the stream.
int64_t FindInvalidChunk(const uint8_t* positions, int64_t n, const Layout& layout);

// Writes the decoding of chunks [first, end) to out[first * chunk, min(end * chunk, n)):
// sign * level at each entry's position, 0 elsewhere. The positions must have passed
// FindInvalidChunk; `codes` holds PackedBytes(TotalKept(n), 2) bytes and `levels`
// 2 * NumChunks(n) floats. `first` is a multiple of 8.
void Decode(const uint8_t* positions, const uint8_t* codes, const float* levels, int64_t n,
            const Layout& layout, int64_t first, int64_t end, float* out);

}  // namespace chunk_top_k
}  // namespace tfgc

#endif  // TFGC_OPS_CC_CHUNK_TOP_K_H_
