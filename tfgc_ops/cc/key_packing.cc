#include "key_packing.h"

#include <algorithm>
#include <cstring>
#include <limits>

namespace tfgc {
namespace key_packing {
namespace {

// Writes bits most significant first. Bytes are assigned, not OR-ed: the caller merges
// the partial first byte of a stream that starts mid-byte.
class BitWriter {
 public:
  BitWriter(uint8_t* out, int first_bit) : out_(out), pending_bits_(first_bit) {}

  void Put(uint64_t value, int bits) {
    if (bits > 32) {
      PutShort(value >> 32, bits - 32);
      PutShort(value & 0xFFFFFFFFULL, 32);
    } else {
      PutShort(value, bits);
    }
  }

  void Flush() {
    if (pending_bits_ > 0) *out_ = static_cast<uint8_t>(pending_ << (8 - pending_bits_));
  }

 private:
  void PutShort(uint64_t value, int bits) {  // bits <= 32
    pending_ = (pending_ << bits) | value;
    pending_bits_ += bits;
    while (pending_bits_ >= 8) {
      pending_bits_ -= 8;
      *out_++ = static_cast<uint8_t>(pending_ >> pending_bits_);
    }
  }

  uint8_t* out_;
  uint64_t pending_ = 0;  // the low pending_bits_ bits are not yet written
  int pending_bits_;
};

// Reads bits most significant first, refusing to read past the end.
class BitReader {
 public:
  BitReader(const uint8_t* data, int64_t size) : data_(data), size_(size) {}

  bool Get(int bits, uint64_t* value) {
    if (bits > 8 * size_ - position_) return false;
    if (bits > 32) {
      const uint64_t high = GetShort(bits - 32);
      *value = (high << 32) | GetShort(32);
    } else {
      *value = GetShort(bits);
    }
    return true;
  }

  int64_t position() const { return position_; }

 private:
  uint64_t GetShort(int bits) {  // bits <= 32, already bounds-checked
    if (bits == 0) return 0;
    const int64_t byte = position_ >> 3;
    const int shift = static_cast<int>(position_ & 7);
    uint64_t word = 0;
    const int64_t available = std::min<int64_t>(8, size_ - byte);
    for (int64_t i = 0; i < available; ++i) word |= uint64_t{data_[byte + i]} << (56 - 8 * i);
    position_ += bits;
    return (word << shift) >> (64 - bits);
  }

  const uint8_t* data_;
  int64_t size_;
  int64_t position_ = 0;
};

uint64_t Delta(const int64_t* keys, int64_t j, int64_t previous) {
  const int64_t before = j > 0 ? keys[j - 1] : std::max<int64_t>(previous, 0);
  return static_cast<uint64_t>(keys[j] - before);
}

}  // namespace

int BitLength(uint64_t v) { return v == 0 ? 0 : 64 - __builtin_clzll(v); }

CodeBook::CodeBook(int max_bits_in, int flag_bits_in)
    : max_bits(max_bits_in), flag_bits(flag_bits_in) {
  const int classes = 1 << flag_bits;
  for (int c = 0; c < classes; ++c) {
    length[c] = ((c + 1) * max_bits + classes - 1) / classes;  // ceil((c+1) M / 2^l)
  }
  int c = 0;
  for (int bits = 0; bits <= kMaxDeltaBits; ++bits) {
    while (c + 1 < classes && length[c] < bits) ++c;
    class_of_bit_length[bits] = c;
  }
}

int64_t CodeBook::EntryBits(uint64_t delta) const {
  return flag_bits + length[class_of_bit_length[BitLength(delta)]];
}

std::string CheckKeys(const int64_t* keys, int64_t n, int64_t previous, int64_t first_index) {
  for (int64_t j = 0; j < n; ++j) {
    if (keys[j] < 0) {
      return "keys must be non-negative, but key " + std::to_string(first_index + j) + " is " +
             std::to_string(keys[j]);
    }
    const int64_t before = j > 0 ? keys[j - 1] : previous;
    if (keys[j] <= before) {
      return "keys must be strictly increasing, but key " + std::to_string(first_index + j) + " (" +
             std::to_string(keys[j]) + ") follows " + std::to_string(before);
    }
  }
  return "";
}

uint64_t MaxDelta(const int64_t* keys, int64_t n, int64_t previous) {
  uint64_t largest = 0;
  for (int64_t j = 0; j < n; ++j) largest = std::max(largest, Delta(keys, j, previous));
  return largest;
}

int64_t StreamBits(const CodeBook& book, const int64_t* keys, int64_t n, int64_t previous) {
  int64_t bits = 0;
  for (int64_t j = 0; j < n; ++j) bits += book.EntryBits(Delta(keys, j, previous));
  return bits;
}

std::vector<uint8_t> Header(int flag_bits, int max_bits, int64_t count) {
  std::vector<uint8_t> header = {static_cast<uint8_t>(flag_bits),
                                 static_cast<uint8_t>(max_bits)};
  uint64_t rest = static_cast<uint64_t>(count);
  do {
    const uint8_t low = rest & 0x7F;
    rest >>= 7;
    header.push_back(rest ? (low | 0x80) : low);
  } while (rest);
  return header;
}

void WriteStream(const CodeBook& book, const int64_t* keys, int64_t n, int64_t previous,
                 int first_bit, uint8_t* out) {
  BitWriter writer(out, first_bit);
  for (int64_t j = 0; j < n; ++j) {
    const uint64_t delta = Delta(keys, j, previous);
    const int c = book.class_of_bit_length[BitLength(delta)];
    writer.Put(c, book.flag_bits);
    writer.Put(delta, book.length[c]);
  }
  writer.Flush();
}

std::vector<uint8_t> Pack(const int64_t* keys, int64_t n, int flag_bits) {
  const CodeBook book(BitLength(MaxDelta(keys, n, -1)), flag_bits);
  std::vector<uint8_t> packed = Header(flag_bits, book.max_bits, n);
  const int64_t header_size = static_cast<int64_t>(packed.size());
  const int64_t bits = StreamBits(book, keys, n, -1);
  packed.resize(header_size + (bits + 7) / 8, 0);
  WriteStream(book, keys, n, -1, 0, packed.data() + header_size);
  return packed;
}

bool ParseHeader(const uint8_t* packed, int64_t size, int* flag_bits, int* max_bits,
                 int64_t* count, int64_t* header_size, std::string* error) {
  if (size < 3) {
    *error = "packed keys need at least 3 header bytes, got " + std::to_string(size);
    return false;
  }
  *flag_bits = packed[0];
  *max_bits = packed[1];
  if (*flag_bits < kMinFlagBits || *flag_bits > kMaxFlagBits) {
    *error = "flag bits in header must be in [1, 5], got " + std::to_string(*flag_bits);
    return false;
  }
  if (*max_bits > kMaxDeltaBits) {
    *error = "delta bit length in header must be <= 63, got " + std::to_string(*max_bits);
    return false;
  }
  uint64_t value = 0;
  int64_t i = 2;
  // Nine 7-bit groups hold every non-negative int64; a tenth would exceed it.
  for (int shift = 0;; shift += 7) {
    if (shift >= 63) {
      *error = "key count in header exceeds int64";
      return false;
    }
    if (i >= size) {
      *error = "truncated key count in header";
      return false;
    }
    value |= uint64_t{packed[i] & 0x7Fu} << shift;
    if ((packed[i++] & 0x80) == 0) break;
  }
  *count = static_cast<int64_t>(value);
  *header_size = i;
  // Refuse counts the stream cannot hold before anyone allocates for them. The first
  // entry takes at least flag_bits bits; every later one carries a delta >= 1, so it
  // also takes the shortest non-zero code length. With no such code (a delta bit
  // length of 0) at most one key can be valid.
  const CodeBook book(*max_bits, *flag_bits);
  int shortest = 0;
  for (int c = 0; c < (1 << *flag_bits); ++c) {
    if (book.length[c] > 0 && (shortest == 0 || book.length[c] < shortest)) {
      shortest = book.length[c];
    }
  }
  const int64_t stream_bits = 8 * (size - i);
  int64_t capacity = stream_bits >= *flag_bits ? 1 : 0;
  if (capacity == 1 && shortest > 0) {
    capacity += (stream_bits - *flag_bits) / (*flag_bits + shortest);
  }
  if (*count > capacity) {
    *error = "header claims " + std::to_string(*count) + " keys but the stream holds " +
             std::to_string(stream_bits) + " bits";
    return false;
  }
  return true;
}

bool UnpackInto(const uint8_t* packed, int64_t size, int64_t* out, std::string* error) {
  int flag_bits, max_bits;
  int64_t count, header_size;
  if (!ParseHeader(packed, size, &flag_bits, &max_bits, &count, &header_size, error)) {
    return false;
  }
  const CodeBook book(max_bits, flag_bits);
  BitReader reader(packed + header_size, size - header_size);
  int64_t key = 0;
  for (int64_t j = 0; j < count; ++j) {
    uint64_t c, delta;
    if (!reader.Get(flag_bits, &c) || !reader.Get(book.length[c], &delta)) {
      *error = "packed keys end inside entry " + std::to_string(j);
      return false;
    }
    if (j > 0 && delta == 0) {
      *error = "entry " + std::to_string(j) + " has delta 0: keys must be strictly increasing";
      return false;
    }
    if (delta > static_cast<uint64_t>(std::numeric_limits<int64_t>::max() - key)) {
      *error = "entry " + std::to_string(j) + " overflows int64";
      return false;
    }
    key += static_cast<int64_t>(delta);
    out[j] = key;
  }
  const int64_t used_bits = reader.position();
  const int64_t stream_size = size - header_size;
  if ((used_bits + 7) / 8 != stream_size) {
    *error = "packed keys have " + std::to_string(stream_size - (used_bits + 7) / 8) +
             " stray bytes after the last entry";
    return false;
  }
  uint64_t padding = 0;
  if (!reader.Get(static_cast<int>(8 * stream_size - used_bits), &padding) || padding != 0) {
    *error = "padding bits after the last entry must be zero";
    return false;
  }
  return true;
}

bool Unpack(const uint8_t* packed, int64_t size, std::vector<int64_t>* keys,
            std::string* error) {
  int flag_bits, max_bits;
  int64_t count, header_size;
  if (!ParseHeader(packed, size, &flag_bits, &max_bits, &count, &header_size, error)) {
    return false;
  }
  keys->resize(count);
  return UnpackInto(packed, size, keys->data(), error);
}

}  // namespace key_packing
}  // namespace tfgc
