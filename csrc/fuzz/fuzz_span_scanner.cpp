// Fuzz driver for the span scanner.
//
// Input format (any byte string is a valid input; see csrc/fuzz/corpus/README.md):
//   byte 0    flags. bit 0: put the tag table's markers in the vocabulary as single tokens first.
//                    bit 1: also feed corrupted seq_offsets, which must be rejected by
//                           std::invalid_argument (never a crash).
//                    bit 2: scan with the JSON tool-call tag table (mem, think, tool_call,
//                           answer, tool_response; actions tool_call and answer; opaque
//                           tool_response) instead of the default six tags.
//   rest      sequences separated by '\n'; tokens of a sequence separated by '|'. A token "@N"
//             (N a signed decimal, e.g. "@-3", "@99999") is the raw id N, possibly outside the
//             vocabulary; any other token is a vocabulary entry with exactly those bytes (the
//             empty token is a zero-byte token). Distinct entries get ids in order of first
//             appearance.
//
// Every input is scanned on the byte path and on the token path; both must agree with an
// independent naive implementation in this file (brute-force marker search at every byte, its
// own state machine, token overlap computed by definition), and the output must be well formed.
// Any disagreement aborts, so sanitizer builds and plain builds both report failures.
//
// Build modes: by default a main() that takes corpus files/directories and `--random N
// [--seed S]` (N generated inputs: fresh ones and mutations of the given corpus); with
// -DMEMPO_LIBFUZZER (clang -fsanitize=fuzzer) only LLVMFuzzerTestOneInput is compiled.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "span_scanner.hpp"

#ifndef MEMPO_LIBFUZZER
#include <filesystem>
#include <fstream>
#include <iterator>
#endif

using namespace mempo::scanner;

namespace {

const TagTable& json_tool_call_tags() {
  static const TagTable table({"mem", "think", "tool_call", "answer", "tool_response"}, {2, 3}, 4);
  return table;
}

const TagTable& tags_of(std::uint8_t flags) {
  return (flags & 4) ? json_tool_call_tags() : TagTable::mempo_default();
}

[[noreturn]] void fail(const char* what, std::size_t seq) {
  std::fprintf(stderr, "fuzz_span_scanner: invariant violated: %s (sequence %zu)\n", what, seq);
  std::abort();
}

struct Batch {
  std::vector<std::string> vocab;
  std::vector<std::int64_t> ids;
  std::vector<std::int64_t> seq_offsets{0};
};

bool parse_raw_id(std::string_view token, std::int64_t* id) {
  if (token.size() < 2 || token[0] != '@') return false;
  std::size_t at = 1;
  bool negative = false;
  if (token[at] == '-') {
    negative = true;
    ++at;
  }
  if (at == token.size() || token.size() - at > 18) return false;  // 18 digits fit int64
  std::int64_t value = 0;
  for (; at < token.size(); ++at) {
    if (token[at] < '0' || token[at] > '9') return false;
    value = value * 10 + (token[at] - '0');
  }
  *id = negative ? -value : value;
  return true;
}

Batch parse(const std::uint8_t* data, std::size_t size, std::uint8_t flags) {
  Batch batch;
  std::unordered_map<std::string, std::int64_t> id_of;
  const auto add_entry = [&](const std::string& token) {
    const auto [it, inserted] = id_of.emplace(token, static_cast<std::int64_t>(batch.vocab.size()));
    if (inserted) batch.vocab.push_back(token);
    return it->second;
  };
  if (flags & 1) {
    const TagTable& tags = tags_of(flags);
    for (int code = 0; code < tags.num_markers(); ++code) add_entry(tags.marker(code));
  }
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  std::size_t token_begin = 0;
  for (std::size_t at = 0; at <= body.size(); ++at) {
    const bool end_of_body = at == body.size();
    if (!end_of_body && body[at] != '|' && body[at] != '\n') continue;
    const std::string_view token = body.substr(token_begin, at - token_begin);
    std::int64_t id = 0;
    if (!parse_raw_id(token, &id)) id = add_entry(std::string(token));
    batch.ids.push_back(id);
    if (end_of_body || body[at] == '\n') {
      batch.seq_offsets.push_back(static_cast<std::int64_t>(batch.ids.size()));
    }
    token_begin = at + 1;
  }
  return batch;
}

SpanScanner make_scanner(const std::vector<std::string>& vocab, bool token_path,
                         const TagTable& tags) {
  std::vector<std::uint8_t> bytes;
  std::vector<std::int64_t> offsets{0};
  for (const auto& token : vocab) {
    bytes.insert(bytes.end(), token.begin(), token.end());
    offsets.push_back(static_cast<std::int64_t>(bytes.size()));
  }
  return SpanScanner(std::move(bytes), std::move(offsets), token_path, tags);
}

// ---- the independent naive implementation --------------------------------------------------

struct NaiveSpan {
  std::int64_t tag, start, end, round;
  bool closed;
};

std::vector<NaiveSpan> naive_spans(const TagTable& tags, const std::vector<std::string>& vocab,
                                   const std::int64_t* ids, std::int64_t n) {
  std::string text;
  std::vector<std::int64_t> token_begin, token_end;
  for (std::int64_t i = 0; i < n; ++i) {
    token_begin.push_back(static_cast<std::int64_t>(text.size()));
    if (ids[i] >= 0 && ids[i] < static_cast<std::int64_t>(vocab.size())) {
      text += vocab[static_cast<std::size_t>(ids[i])];
    }
    token_end.push_back(static_cast<std::int64_t>(text.size()));
  }
  struct ByteBlock {
    int tag;
    std::int64_t begin, end, round;
    bool closed;
  };
  std::vector<ByteBlock> blocks;
  int open = -1;
  std::int64_t open_begin = 0, open_round = 0, round = 0;
  bool finished = false;
  for (std::size_t pos = 0; pos < text.size(); ++pos) {
    int tag = -1;
    bool closing = false;
    std::size_t length = 0;
    for (int code = 0; code < tags.num_markers() && tag < 0; ++code) {
      const std::string& marker = tags.marker(code);
      if (text.compare(pos, marker.size(), marker) == 0) {
        tag = code / 2;
        closing = code & 1;
        length = marker.size();
      }
    }
    if (tag < 0) continue;
    const auto begin = static_cast<std::int64_t>(pos);
    const auto end = static_cast<std::int64_t>(pos + length);
    pos += length - 1;
    const int opaque = tags.opaque_tag();
    if (open >= 0 && open == opaque && !(closing && tag == opaque)) continue;
    if (closing) {
      if (tag == open) {
        blocks.push_back({tag, open_begin, end, open_round, true});
        open = -1;
      }
      continue;
    }
    if (open >= 0) blocks.push_back({open, open_begin, begin, open_round, false});
    if (tag != opaque) {
      if (finished) ++round;  // the previous action finished the round
      finished = tags.is_action(tag);
    }
    open = tag;
    open_begin = begin;
    open_round = round;
  }
  if (open >= 0) {
    blocks.push_back({open, open_begin, static_cast<std::int64_t>(text.size()), open_round, false});
  }
  std::vector<NaiveSpan> spans;
  for (const auto& block : blocks) {
    std::int64_t first = -1, last = -1;
    for (std::int64_t i = 0; i < n; ++i) {
      const auto b = token_begin[static_cast<std::size_t>(i)];
      const auto e = token_end[static_cast<std::size_t>(i)];
      if (b < e && b < block.end && e > block.begin) {
        if (first < 0) first = i;
        last = i;
      }
    }
    spans.push_back({block.tag, first, last + 1, block.round, block.closed});
  }
  return spans;
}

// ---- checks --------------------------------------------------------------------------------

void check_well_formed(const SpanArrays& out, const Batch& batch, int num_tags) {
  const std::size_t num_seqs = batch.seq_offsets.size() - 1;
  if (out.seq_offsets.size() != num_seqs + 1 || out.seq_offsets.front() != 0 ||
      out.seq_offsets.back() != static_cast<std::int64_t>(out.tag.size())) {
    fail("span offsets malformed", 0);
  }
  const std::size_t spans = out.tag.size();
  if (out.start.size() != spans || out.end.size() != spans || out.round.size() != spans ||
      out.closed.size() != spans) {
    fail("span arrays differ in length", 0);
  }
  for (std::size_t s = 0; s < num_seqs; ++s) {
    const std::int64_t n = batch.seq_offsets[s + 1] - batch.seq_offsets[s];
    for (auto k = out.seq_offsets[s]; k < out.seq_offsets[s + 1]; ++k) {
      const auto i = static_cast<std::size_t>(k);
      if (out.tag[i] < 0 || out.tag[i] >= num_tags) fail("tag code out of range", s);
      if (!(0 <= out.start[i] && out.start[i] < out.end[i] && out.end[i] <= n)) {
        fail("span outside its sequence or empty", s);
      }
      if (out.closed[i] > 1) fail("closed is not 0/1", s);
      if (k > out.seq_offsets[s]) {
        if (out.start[i] < out.start[i - 1] || out.end[i] < out.end[i - 1]) {
          fail("spans unordered", s);
        }
        if (out.round[i] < out.round[i - 1]) fail("rounds decrease", s);
      } else if (out.round[i] < 0) {
        fail("negative round", s);
      }
    }
  }
}

void check_against_naive(const SpanArrays& out, const Batch& batch, const TagTable& tags) {
  for (std::size_t s = 0; s + 1 < batch.seq_offsets.size(); ++s) {
    const auto lo = batch.seq_offsets[s];
    const auto expected =
        naive_spans(tags, batch.vocab, batch.ids.data() + lo, batch.seq_offsets[s + 1] - lo);
    const auto first = static_cast<std::size_t>(out.seq_offsets[s]);
    if (static_cast<std::size_t>(out.seq_offsets[s + 1]) - first != expected.size()) {
      fail("span count differs from the naive scanner", s);
    }
    for (std::size_t k = 0; k < expected.size(); ++k) {
      const auto i = first + k;
      const auto& e = expected[k];
      if (out.tag[i] != e.tag || out.start[i] != e.start || out.end[i] != e.end ||
          out.round[i] != e.round || (out.closed[i] != 0) != e.closed) {
        fail("span differs from the naive scanner", s);
      }
    }
  }
}

void run_one(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return;
  const std::uint8_t flags = data[0];
  const Batch batch = parse(data + 1, size - 1, flags);
  const auto num_ids = static_cast<std::int64_t>(batch.ids.size());
  const auto num_seqs = static_cast<std::int64_t>(batch.seq_offsets.size()) - 1;

  const TagTable& tags = tags_of(flags);
  const SpanScanner byte_path = make_scanner(batch.vocab, false, tags);
  const SpanScanner token_path = make_scanner(batch.vocab, true, tags);
  SpanArrays by_bytes, by_tokens;
  std::int64_t bad_by_bytes = 0, bad_by_tokens = 0;
  byte_path.scan(batch.ids.data(), num_ids, batch.seq_offsets.data(), num_seqs, by_bytes,
                 &bad_by_bytes);
  token_path.scan(batch.ids.data(), num_ids, batch.seq_offsets.data(), num_seqs, by_tokens,
                  &bad_by_tokens);
  const auto vocab_size = static_cast<std::int64_t>(batch.vocab.size());
  std::int64_t first_bad = -1;
  for (std::int64_t i = 0; i < num_ids && first_bad < 0; ++i) {
    if (batch.ids[static_cast<std::size_t>(i)] < 0 ||
        batch.ids[static_cast<std::size_t>(i)] >= vocab_size) {
      first_bad = i;
    }
  }
  if (bad_by_bytes != first_bad || bad_by_tokens != first_bad) {
    fail("first out-of-vocabulary id misreported", 0);
  }
  check_well_formed(by_bytes, batch, tags.num_tags());
  if (by_bytes.seq_offsets != by_tokens.seq_offsets || by_bytes.tag != by_tokens.tag ||
      by_bytes.start != by_tokens.start || by_bytes.end != by_tokens.end ||
      by_bytes.round != by_tokens.round || by_bytes.closed != by_tokens.closed) {
    fail("token path differs from byte path", 0);
  }
  // The naive check is quadratic in sequence length; fuzz inputs are small.
  if (size <= 4096) check_against_naive(by_bytes, batch, tags);

  if (flags & 2) {
    std::vector<std::int64_t> corrupt = batch.seq_offsets;
    const std::size_t which = static_cast<std::size_t>(data[size - 1]) % corrupt.size();
    corrupt[which] += (which == 0 || corrupt.size() == 1) ? 1 : -(num_ids + 1);
    try {
      byte_path.scan(batch.ids.data(), num_ids, corrupt.data(), num_seqs, by_bytes);
      fail("corrupted seq_offsets were accepted", which);
    } catch (const std::invalid_argument&) {
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  run_one(data, size);
  return 0;
}

#ifndef MEMPO_LIBFUZZER
namespace {

const char* const kFragments[] = {
    "<mem>", "</mem>", "<think>", "</think>", "<search>", "</search>", "<access>", "</access>",
    "<answer>", "</answer>", "<information>", "</information>", "<", ">", "</", "/", "mem",
    "think", "search", "access", "answer", "information", "mem>", "<mem", "><", "\n", "|", "||",
    "@-1", "@0", "@5", "@999999", "@-9223372036854775", "hello", " world", "a<b", "<MEM>", "",
    "inform", "ation>", "<info", "\xff\xfe", "\xe6\x9d\xb1",
    "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<tool", "_call>",
    "</tool_", "response>", "tool_call", "<tool_call", "{\"name\": \"lookup\", \"arguments\": {}}",
    "\"", "{", "}",
};

std::string random_input(std::mt19937_64& rng, const std::vector<std::string>& corpus) {
  std::string input;
  if (!corpus.empty() && rng() % 2 == 0) {
    input = corpus[rng() % corpus.size()];
    const int edits = 1 + static_cast<int>(rng() % 8);
    for (int e = 0; e < edits; ++e) {
      const std::size_t at = input.empty() ? 0 : rng() % (input.size() + 1);
      switch (rng() % 4) {
        case 0:  // insert a fragment
          input.insert(at, kFragments[rng() % std::size(kFragments)]);
          break;
        case 1:  // delete a range
          if (at < input.size()) input.erase(at, 1 + rng() % 8);
          break;
        case 2:  // flip a byte
          if (at < input.size()) input[at] = static_cast<char>(input[at] ^ (1u << (rng() % 8)));
          break;
        default:  // duplicate a range
          if (at < input.size()) input.insert(at, input.substr(at, 1 + rng() % 16));
      }
    }
    if (input.empty()) input.push_back(static_cast<char>(rng() & 7));
    return input;
  }
  input.push_back(static_cast<char>(rng() & 7));
  const int pieces = static_cast<int>(rng() % 64);
  for (int p = 0; p < pieces; ++p) {
    input += kFragments[rng() % std::size(kFragments)];
    const auto roll = rng() % 4;
    if (roll == 0) input += '|';
    if (roll == 1 && rng() % 4 == 0) input += '\n';
  }
  return input;
}

bool read_file(const std::filesystem::path& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  out->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> corpus;
  long long random_count = 0;
  unsigned long long seed = 0;
  for (int a = 1; a < argc; ++a) {
    const std::string arg = argv[a];
    if (arg == "--random" && a + 1 < argc) {
      random_count = std::atoll(argv[++a]);
    } else if (arg == "--seed" && a + 1 < argc) {
      seed = std::strtoull(argv[++a], nullptr, 10);
    } else {
      const std::filesystem::path path(arg);
      std::vector<std::filesystem::path> files;
      if (std::filesystem::is_directory(path)) {
        for (const auto& entry : std::filesystem::directory_iterator(path)) {
          if (entry.is_regular_file() && entry.path().filename() != "README.md") {
            files.push_back(entry.path());
          }
        }
        std::sort(files.begin(), files.end());
      } else {
        files.push_back(path);
      }
      for (const auto& file : files) {
        std::string data;
        if (!read_file(file, &data)) {
          std::fprintf(stderr, "fuzz_span_scanner: cannot read %s\n", file.string().c_str());
          return 2;
        }
        corpus.push_back(data);
      }
    }
  }
  for (const auto& data : corpus) {
    run_one(reinterpret_cast<const std::uint8_t*>(data.data()), data.size());
  }
  std::mt19937_64 rng(seed);
  for (long long i = 0; i < random_count; ++i) {
    const std::string data = random_input(rng, corpus);
    run_one(reinterpret_cast<const std::uint8_t*>(data.data()), data.size());
  }
  std::printf("fuzz_span_scanner: %zu corpus inputs, %lld random inputs, no findings\n",
              corpus.size(), random_count);
  return 0;
}
#endif
