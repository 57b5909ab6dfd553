// libFuzzer target: key packing of fuzzer-chosen key lists.
//
// Input: byte 0 picks the flag bits (1..5); byte 1 picks the block size (1..64 keys) for
// the multi-block composition; the rest is a list of key deltas, one token each:
//   0xxxxxxx          delta x (0..127)
//   10xxxxxx + LEB128 delta: the LEB128 value (up to 63 bits), x ignored
//   110ppppp + byte   delta 2^p' + (signed byte), p' = ppppp + 32 (2^32..2^63 region)
//   111ppppp + byte   delta 2^p + (signed byte) for p = 0..31, or, for p = 31, the largest
//                     delta that keeps the key in range (reaches INT64_MAX)
// The first delta is the first key (0 allowed); later deltas of 0 become 1; a delta that
// would take the key past INT64_MAX ends the list.
//
// Checks:
//   * The keys pass CheckKeys; Pack's header holds the flag bits, M = BitLength of the
//     largest delta, and the count; its size is header + ceil(StreamBits / 8).
//   * Unpack(Pack(keys)) gives the keys back exactly; every entry takes exactly
//     CodeBook::EntryBits bits and a naive bit-by-bit encoder gives the same stream.
//   * Composing the stream from blocks the way key_packing_ops.cc does (per-block
//     MaxDelta/StreamBits with the previous key, WriteStream at the block's first_bit
//     into its own exactly-sized buffer, first bytes merged with OR) equals Pack byte for
//     byte, and the OR never merges two set bits.
//   * CheckKeys, on the whole list and on the block holding it, rejects a copy of the keys
//     with one key made negative or not larger than its predecessor, naming that key.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "fuzz_check.h"
#include "key_packing.h"

namespace kp = ::tfgc::key_packing;
using tfgc_fuzz::Check;

namespace {


constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

std::vector<int64_t> KeysFromBytes(const uint8_t* p, size_t n) {
  std::vector<int64_t> keys;
  size_t i = 0;
  int64_t key = 0;
  while (i < n) {
    const uint8_t t = p[i++];
    uint64_t delta;
    if ((t & 0x80) == 0) {
      delta = t;
    } else if ((t & 0xC0) == 0x80) {
      delta = 0;
      for (int shift = 0; shift < 63 && i < n; shift += 7) {
        const uint8_t b = p[i++];
        delta |= uint64_t{b & 0x7Fu} << shift;
        if ((b & 0x80) == 0) break;
      }
      delta &= static_cast<uint64_t>(kMax);
    } else {
      const int adjust = i < n ? static_cast<int8_t>(p[i++]) : 0;
      const int low = t & 31;
      if ((t & 0xE0) == 0xE0 && low == 31 && !keys.empty()) {
        delta = static_cast<uint64_t>(kMax - key);
      } else {
        const int power = (t & 0xE0) == 0xC0 ? std::min(low + 32, 62) + (low == 31) : low;
        delta = (uint64_t{1} << power) + static_cast<uint64_t>(static_cast<int64_t>(adjust));
        delta &= static_cast<uint64_t>(kMax);
      }
    }
    if (!keys.empty() && delta == 0) delta = 1;
    const int64_t base = keys.empty() ? 0 : key;
    if (delta > static_cast<uint64_t>(kMax - base)) break;
    key = base + static_cast<int64_t>(delta);
    keys.push_back(key);
  }
  return keys;
}

// Bit-by-bit reference of the stream: flag (class) then the delta in length[class] bits,
// both most significant bit first, classes chosen as the shortest that holds the delta.
std::vector<uint8_t> NaiveStream(const int64_t* keys, int64_t n, int flag_bits) {
  uint64_t largest = 0;
  for (int64_t j = 0; j < n; ++j) {
    largest = std::max<uint64_t>(largest, keys[j] - (j ? keys[j - 1] : 0));
  }
  int m = 0;
  while (m < 64 && (largest >> m) != 0) ++m;
  const int classes = 1 << flag_bits;
  std::vector<bool> bits;
  auto put = [&bits](uint64_t v, int len) {
    for (int b = len - 1; b >= 0; --b) bits.push_back((v >> b) & 1);
  };
  for (int64_t j = 0; j < n; ++j) {
    const uint64_t delta = keys[j] - (j ? keys[j - 1] : 0);
    int c = 0;
    while (true) {
      const int len = ((c + 1) * m + classes - 1) / classes;
      if (len >= 64 || (delta >> len) == 0 || c == classes - 1) break;
      ++c;
    }
    put(c, flag_bits);
    put(delta, ((c + 1) * m + classes - 1) / classes);
  }
  std::vector<uint8_t> out((bits.size() + 7) / 8, 0);
  for (size_t b = 0; b < bits.size(); ++b) {
    if (bits[b]) out[b / 8] |= static_cast<uint8_t>(0x80 >> (b % 8));
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const int flag_bits = 1 + data[0] % 5;
  const int64_t block_keys = 1 + (data[1] & 63);
  const std::vector<int64_t> keys = KeysFromBytes(data + 2, size - 2);
  const int64_t n = static_cast<int64_t>(keys.size());
  const int64_t* k = keys.data();
  Check(kp::CheckKeys(k, n, -1, 0).empty(), "generated keys fail CheckKeys");

  // Single-threaded packing.
  const std::vector<uint8_t> packed = kp::Pack(k, n, flag_bits);
  const int max_bits = kp::BitLength(kp::MaxDelta(k, n, -1));
  const kp::CodeBook book(max_bits, flag_bits);
  const std::vector<uint8_t> header = kp::Header(flag_bits, max_bits, n);
  const int64_t stream_bits = kp::StreamBits(book, k, n, -1);
  Check(packed.size() == header.size() + static_cast<size_t>((stream_bits + 7) / 8),
        "Pack size");
  Check(std::equal(header.begin(), header.end(), packed.begin()), "Pack header");
  Check(std::vector<uint8_t>(packed.begin() + header.size(), packed.end()) ==
            NaiveStream(k, n, flag_bits),
        "Pack stream differs from the naive bit writer");

  int pf, pm;
  int64_t pc, ph;
  std::string error;
  Check(kp::ParseHeader(packed.data(), static_cast<int64_t>(packed.size()), &pf, &pm, &pc, &ph,
                        &error),
        "ParseHeader rejects Pack's header");
  Check(pf == flag_bits && pm == max_bits && pc == n &&
            ph == static_cast<int64_t>(header.size()),
        "ParseHeader fields");
  std::vector<int64_t> unpacked;
  Check(kp::Unpack(packed.data(), static_cast<int64_t>(packed.size()), &unpacked, &error),
        "Unpack rejects Pack's output");
  Check(unpacked == keys, "Pack/Unpack roundtrip");

  // Multi-block composition, as in PackKeysOp::Compute.
  const int64_t num_blocks = (n + block_keys - 1) / block_keys;
  auto begin_of = [n, block_keys](int64_t b) { return std::min(n, b * block_keys); };
  auto previous_of = [k, &begin_of](int64_t b) {
    return b == 0 ? int64_t{-1} : k[begin_of(b) - 1];
  };
  uint64_t largest = 0;
  for (int64_t b = 0; b < num_blocks; ++b) {
    const int64_t begin = begin_of(b), len = begin_of(b + 1) - begin;
    Check(kp::CheckKeys(k + begin, len, previous_of(b), begin).empty(), "block CheckKeys");
    largest = std::max(largest, kp::MaxDelta(k + begin, len, previous_of(b)));
  }
  Check(kp::BitLength(largest) == max_bits, "block MaxDelta");
  std::vector<int64_t> bit_offset(num_blocks + 1, 0);
  for (int64_t b = 0; b < num_blocks; ++b) {
    const int64_t begin = begin_of(b);
    bit_offset[b + 1] =
        bit_offset[b] + kp::StreamBits(book, k + begin, begin_of(b + 1) - begin, previous_of(b));
  }
  Check(bit_offset[num_blocks] == stream_bits, "block StreamBits sum");
  std::vector<uint8_t> composed = header;
  const size_t header_size = composed.size();
  composed.resize(header_size + (stream_bits + 7) / 8, 0);
  uint8_t* stream = composed.data() + header_size;
  for (int64_t b = 0; b < num_blocks; ++b) {
    const int64_t begin = begin_of(b);
    const int first_bit = static_cast<int>(bit_offset[b] % 8);
    std::vector<uint8_t> part((first_bit + bit_offset[b + 1] - bit_offset[b] + 7) / 8, 0);
    kp::WriteStream(book, k + begin, begin_of(b + 1) - begin, previous_of(b), first_bit,
                    part.data());
    if (part.empty()) continue;
    Check((part[0] >> (8 - first_bit) == 0) || first_bit == 0,
          "WriteStream set bits before first_bit");
    uint8_t* dst = stream + bit_offset[b] / 8;
    Check((dst[0] & part[0]) == 0, "block merge ORs two set bits");
    dst[0] |= part[0];
    std::copy(part.begin() + 1, part.end(), dst + 1);
  }
  Check(composed == packed, "multi-block composition differs from Pack");

  // CheckKeys rejects a broken copy and names the broken key, whole and per block.
  if (n > 0) {
    const int64_t j = (data[0] / 5) % n;
    std::vector<int64_t> bad = keys;
    bad[j] = j == 0 ? -1 - bad[0] % 7 : bad[j - 1] - (data[0] & 1);
    const std::string name = "key " + std::to_string(j) + " ";
    const std::string whole = kp::CheckKeys(bad.data(), n, -1, 0);
    Check(whole.find(name) != std::string::npos, "CheckKeys misses or misnames a bad key");
    const int64_t b = j / block_keys, begin = begin_of(b);
    const int64_t previous = b == 0 ? -1 : bad[begin - 1];
    const std::string block =
        kp::CheckKeys(bad.data() + begin, begin_of(b + 1) - begin, previous, begin);
    Check(block.find(name) != std::string::npos, "block CheckKeys misses or misnames a bad key");
  }
  return 0;
}
