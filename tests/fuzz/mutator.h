// The mutants fuzz_replay (tests/fuzz/replay.cpp) runs after a target's seed corpus: mutant i is a
// function of the corpus, the seed and i alone (its own generator, seeded from both), so a run's
// sequence is the same on every machine and a finding's index names its input. Each mutant is a
// corpus input with one to four edits, libFuzzer's kinds without its coverage feedback: a bit
// flipped, a byte set to a boundary or syntax value, a range erased, random bytes inserted, a range
// duplicated or copied over another, a truncation, a splice with another corpus input, and a run of
// decimal digits in the text replaced by a boundary number (the formats here are mostly text:
// TOML, JSON, CSV, safetensors' JSON header). A mutant grows at most 256 bytes past its input.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace tessera::fuzz {

class Mutator {
 public:
  Mutator(std::vector<std::string> corpus, uint64_t seed) : corpus_(std::move(corpus)), seed_(seed) {}

  std::string mutant(int64_t index) const {
    Random random(seed_ ^ (static_cast<uint64_t>(index) * 0x9e3779b97f4a7c15ULL));
    std::string input = corpus_[random.below(corpus_.size())];
    const size_t limit = input.size() + 256;
    const uint64_t edits = 1 + random.below(4);
    for (uint64_t e = 0; e < edits; ++e) edit(input, random);
    if (input.size() > limit) input.resize(limit);
    return input;
  }

 private:
  // splitmix64: small, fast and the same everywhere.
  struct Random {
    uint64_t state;
    explicit Random(uint64_t seed) : state(seed) {}
    uint64_t next() {
      uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
      return z ^ (z >> 31);
    }
    uint64_t below(uint64_t n) { return n == 0 ? 0 : next() % n; }
  };

  void edit(std::string& s, Random& random) const {
    static const char kBytes[] = {'\0', '\xff', '\x7f', '\x80', '0', '9', '-', '.', '"', '\\', '\n', '[',
                                  ']',  '{',    '}',    ',',    ':', '=', ' ', '#', '%', 'e'};
    static const char* const kNumbers[] = {"0", "-1", "1", "255", "65536", "2147483648", "4294967296",
                                           "9223372036854775807", "18446744073709551616",
                                           "99999999999999999999999", "1e308", "-0", "1.5", "nan"};
    const uint64_t kind = random.below(s.empty() ? 2 : 9);
    const size_t at = random.below(s.size() + 1);
    switch (kind) {
      case 0: {  // insert random bytes
        std::string bytes(1 + random.below(8), '\0');
        for (char& c : bytes) c = static_cast<char>(random.next());
        s.insert(at, bytes);
        break;
      }
      case 1:  // splice: this input's prefix, another's suffix
      {
        const std::string& other = corpus_[random.below(corpus_.size())];
        s = s.substr(0, at) + other.substr(random.below(other.size() + 1));
        break;
      }
      case 2:  // flip a bit
        s[at % s.size()] = static_cast<char>(s[at % s.size()] ^ (1 << random.below(8)));
        break;
      case 3:  // a boundary or syntax byte
        s[at % s.size()] = kBytes[random.below(sizeof kBytes)];
        break;
      case 4:  // erase a range
        s.erase(at % s.size(), 1 + random.below(16));
        break;
      case 5:  // truncate
        s.resize(at % s.size());
        break;
      case 6: {  // duplicate a range in place
        const size_t from = at % s.size();
        s.insert(from, s.substr(from, 1 + random.below(32)));
        break;
      }
      case 7: {  // copy a range over another place
        const size_t from = random.below(s.size()), to = at % s.size();
        const std::string range = s.substr(from, 1 + random.below(32));
        s.replace(to, std::min(range.size(), s.size() - to), range);
        break;
      }
      default: {  // a number in the text becomes a boundary number
        size_t begin = s.find_first_of("0123456789", at % s.size());
        if (begin == std::string::npos) begin = s.find_first_of("0123456789");
        const std::string number = kNumbers[random.below(sizeof kNumbers / sizeof *kNumbers)];
        if (begin == std::string::npos) {
          s.insert(at, number);
          break;
        }
        size_t end = s.find_first_not_of("0123456789", begin);
        if (end == std::string::npos) end = s.size();
        s.replace(begin, end - begin, number);
        break;
      }
    }
  }

  std::vector<std::string> corpus_;
  uint64_t seed_;
};

}  // namespace tessera::fuzz
