// Bit-level packing of sparse gradient keys (FastSGD, section 3.3, Algorithm 2), free of
// TensorFlow.
//
// Keys (non-negative, strictly increasing) become delta keys: the first key itself, then
// differences. M is the bit length of the largest delta. A length flag of l bits (1..5)
// selects one of 2^l code lengths ceil((c + 1) * M / 2^l), c = 0..2^l-1 (for l = 2:
// M/4, M/2, 3M/4, M rounded up); each delta is written after its flag in the shortest
// length that holds it. Bits are written most significant first.
//
// Packed layout (self-describing):
//   byte 0: l (flag bits)   byte 1: M   then: key count as LEB128   then: the bit stream,
//   zero-padded to a whole byte.
#ifndef TFGC_OPS_CC_KEY_PACKING_H_
#define TFGC_OPS_CC_KEY_PACKING_H_

#include <cstdint>
#include <string>
#include <vector>

namespace tfgc {
namespace key_packing {

inline constexpr int kMinFlagBits = 1;
inline constexpr int kMaxFlagBits = 5;
inline constexpr int kMaxDeltaBits = 63;  // deltas of non-negative int64 keys

// Code lengths and the class each delta bit length falls into, for one (M, l).
struct CodeBook {
  CodeBook(int max_bits, int flag_bits);
  int max_bits;
  int flag_bits;
  int length[1 << kMaxFlagBits];          // code length of class c
  int class_of_bit_length[kMaxDeltaBits + 1];  // shortest class holding that many bits
  // Bits one entry takes (flag + code) for a delta.
  int64_t EntryBits(uint64_t delta) const;
};

// Bit length of v (0 for 0).
int BitLength(uint64_t v);

// Returns an empty string if keys[0, n) are non-negative and strictly increasing, or a
// message naming the first offending key. `previous` is the key before keys[0] (-1 if
// keys[0] is the first key); `first_index` is keys[0]'s index, used in the message.
std::string CheckKeys(const int64_t* keys, int64_t n, int64_t previous, int64_t first_index);

// Largest delta in keys[0, n) given the key before them (-1: none).
uint64_t MaxDelta(const int64_t* keys, int64_t n, int64_t previous);

// Bits the entries for keys[0, n) take.
int64_t StreamBits(const CodeBook& book, const int64_t* keys, int64_t n, int64_t previous);

// Header bytes for a key count.
std::vector<uint8_t> Header(int flag_bits, int max_bits, int64_t count);

// Writes the entries for keys[0, n) into out, starting `first_bit` bits into out[0]
// (0..7). out must hold ceil((first_bit + bits) / 8) zeroed bytes.
void WriteStream(const CodeBook& book, const int64_t* keys, int64_t n, int64_t previous,
                 int first_bit, uint8_t* out);

// Single-threaded packing of keys[0, n), which must pass CheckKeys.
std::vector<uint8_t> Pack(const int64_t* keys, int64_t n, int flag_bits);

// Parses the header: flag bits, M, key count and the header's size. Returns false and
// sets *error when the header is malformed or the stream is too short for the count, so
// a caller may allocate `count` keys safely before UnpackInto.
bool ParseHeader(const uint8_t* packed, int64_t size, int* flag_bits, int* max_bits,
                 int64_t* count, int64_t* header_size, std::string* error);

// Decodes the keys of a packed buffer whose header ParseHeader accepted into out[count].
// Returns false and sets *error on a malformed stream (a delta of 0 after the first key,
// a key above the int64 range, a truncated entry, or stray bytes or bits at the end).
// Never reads or writes out of bounds.
bool UnpackInto(const uint8_t* packed, int64_t size, int64_t* out, std::string* error);

// ParseHeader + UnpackInto into a vector.
bool Unpack(const uint8_t* packed, int64_t size, std::vector<int64_t>* keys,
            std::string* error);

}  // namespace key_packing
}  // namespace tfgc

#endif  // TFGC_OPS_CC_KEY_PACKING_H_
