// Unit tests of the C++ span scanner (no framework: a tiny registry and CHECK macros).
// Run through ctest, or directly: ./test_span_scanner [name-substring]
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "span_scanner.hpp"

using namespace mempo::scanner;

namespace {

int g_failures = 0;

#define CHECK(cond)                                                              \
  do {                                                                           \
    if (!(cond)) {                                                               \
      std::fprintf(stderr, "  %s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++g_failures;                                                              \
    }                                                                            \
  } while (0)

#define CHECK_EQ(a, b)                                                                    \
  do {                                                                                    \
    const auto va = (a);                                                                  \
    const auto vb = (b);                                                                  \
    if (!(va == vb)) {                                                                    \
      std::fprintf(stderr, "  %s:%d: CHECK_EQ failed: %s == %s (%lld vs %lld)\n", __FILE__, \
                   __LINE__, #a, #b, static_cast<long long>(va), static_cast<long long>(vb)); \
      ++g_failures;                                                                       \
    }                                                                                     \
  } while (0)

template <class Fn>
bool throws_invalid_argument(Fn&& fn, const char* needle) {
  try {
    fn();
  } catch (const std::invalid_argument& err) {
    return std::strstr(err.what(), needle) != nullptr;
  }
  return false;
}

struct TestCase {
  const char* name;
  std::function<void()> body;
};
std::vector<TestCase>& registry() {
  static std::vector<TestCase> tests;
  return tests;
}
struct Register {
  Register(const char* name, std::function<void()> body) {
    registry().push_back({name, std::move(body)});
  }
};
#define TEST(name)                              \
  void name();                                  \
  const Register register_##name(#name, name);  \
  void name()

std::vector<Block> blocks_of(const std::string& text) {
  std::vector<Block> blocks;
  scan_text(reinterpret_cast<const std::uint8_t*>(text.data()), text.size(), blocks);
  return blocks;
}

std::int64_t find(const std::string& text, const std::string& what, std::size_t from = 0) {
  const auto at = text.find(what, from);
  if (at == std::string::npos) throw std::logic_error("test text lacks " + what);
  return static_cast<std::int64_t>(at);
}

void expect_block(const Block& b, int tag, std::int64_t begin, std::int64_t end,
                  std::int64_t round, bool closed) {
  CHECK_EQ(b.tag, tag);
  CHECK_EQ(b.begin, begin);
  CHECK_EQ(b.end, end);
  CHECK_EQ(b.round, round);
  CHECK_EQ(b.closed, closed);
}

// A scanner over an explicit vocabulary (id = position).
SpanScanner make_scanner(const std::vector<std::string>& vocab, bool token_path) {
  std::vector<std::uint8_t> bytes;
  std::vector<std::int64_t> offsets{0};
  for (const auto& token : vocab) {
    bytes.insert(bytes.end(), token.begin(), token.end());
    offsets.push_back(static_cast<std::int64_t>(bytes.size()));
  }
  return SpanScanner(std::move(bytes), std::move(offsets), token_path);
}

SpanArrays scan_one(const SpanScanner& scanner, const std::vector<std::int64_t>& ids) {
  SpanArrays out;
  const std::int64_t offsets[2] = {0, static_cast<std::int64_t>(ids.size())};
  scanner.scan(ids.data(), static_cast<std::int64_t>(ids.size()), offsets, 1, out);
  return out;
}

bool same(const SpanArrays& a, const SpanArrays& b) {
  return a.seq_offsets == b.seq_offsets && a.tag == b.tag && a.start == b.start &&
         a.end == b.end && a.round == b.round && a.closed == b.closed;
}

// ------------------------------------------------------------------------------------------

TEST(markers_match_exactly) {
  for (int tag = 0; tag < kNumTags; ++tag) {
    for (bool closing : {false, true}) {
      const std::string marker = marker_string(tag, closing);
      const std::string padded = marker + "tail";
      const auto m = match_marker(reinterpret_cast<const std::uint8_t*>(padded.data()),
                                  padded.size());
      CHECK_EQ(m.tag, tag);
      CHECK_EQ(m.closing, closing);
      CHECK_EQ(m.length, marker.size());
      // Cut one byte short: no match, and no read past `available`.
      const auto cut = match_marker(reinterpret_cast<const std::uint8_t*>(marker.data()),
                                    marker.size() - 1);
      CHECK_EQ(cut.length, 0u);
    }
  }
  for (const char* miss : {"<MEM>", "<mem", "< mem>", "<mem >", "<memo>", "</>", "<answe>",
                           "<answerr>", "<<mem>", "mem>", "</ mem>", "<info>", "<i>"}) {
    const auto m = match_marker(reinterpret_cast<const std::uint8_t*>(miss), std::strlen(miss));
    CHECK_EQ(m.length, 0u);
  }
}

TEST(three_round_trajectory) {
  const std::string text =
      "<mem></mem><think>plan</think><search>q1</search>"
      "<information>doc <mem> not a tag </think></information>"
      "<mem>m2</mem><think>t2</think><access>url</access>"
      "<information>page</information>"
      "<mem>m3</mem><think>t3</think><answer>42</answer>";
  const auto blocks = blocks_of(text);
  CHECK_EQ(blocks.size(), 11u);
  if (blocks.size() != 11u) return;
  const auto end_of = [&](const std::string& closing, std::size_t from) {
    return find(text, closing, from) + static_cast<std::int64_t>(closing.size());
  };
  expect_block(blocks[0], 0, 0, end_of("</mem>", 0), 0, true);
  expect_block(blocks[1], 1, find(text, "<think>"), end_of("</think>", 0), 0, true);
  expect_block(blocks[2], 2, find(text, "<search>"), end_of("</search>", 0), 0, true);
  const auto info1 = find(text, "<information>");
  expect_block(blocks[3], 5, info1, end_of("</information>", 0), 0, true);
  const auto mem2 = find(text, "<mem>m2");
  expect_block(blocks[4], 0, mem2, end_of("</mem>", mem2), 1, true);
  CHECK_EQ(blocks[5].round, 1);
  expect_block(blocks[6], 3, find(text, "<access>"), end_of("</access>", 0), 1, true);
  const auto info2 = find(text, "<information>page");
  expect_block(blocks[7], 5, info2, end_of("</information>", info2), 1, true);
  CHECK_EQ(blocks[8].round, 2);
  CHECK_EQ(blocks[9].round, 2);
  expect_block(blocks[10], 4, find(text, "<answer>"), static_cast<std::int64_t>(text.size()), 2,
               true);
}

TEST(unclosed_nesting_and_stray_markers) {
  // Nesting ends the outer block at the inner marker, unclosed.
  std::string text = "<mem>a<think>b</think>";
  auto blocks = blocks_of(text);
  CHECK_EQ(blocks.size(), 2u);
  expect_block(blocks[0], 0, 0, find(text, "<think>"), 0, false);
  expect_block(blocks[1], 1, find(text, "<think>"), static_cast<std::int64_t>(text.size()), 0,
               true);
  // A closing marker of another tag, or with nothing open, is ignored.
  text = "</mem>x<mem>a</think>b</mem>";
  blocks = blocks_of(text);
  CHECK_EQ(blocks.size(), 1u);
  expect_block(blocks[0], 0, find(text, "<mem>"), static_cast<std::int64_t>(text.size()), 0,
               true);
  // The reference implementation's "<mem><mem>" defect: an empty unclosed block, then the block.
  text = "<mem><mem>x</mem>";
  blocks = blocks_of(text);
  CHECK_EQ(blocks.size(), 2u);
  expect_block(blocks[0], 0, 0, 5, 0, false);
  expect_block(blocks[1], 0, 5, static_cast<std::int64_t>(text.size()), 0, true);
}

TEST(truncated_sequence_and_rounds) {
  const std::string text = "<search>a</search><search>b</search><mem>c</mem><answer>trunc";
  const auto blocks = blocks_of(text);
  CHECK_EQ(blocks.size(), 4u);
  if (blocks.size() != 4u) return;
  CHECK_EQ(blocks[0].round, 0);
  CHECK_EQ(blocks[1].round, 1);  // a second action opens a new round
  CHECK_EQ(blocks[2].round, 2);
  expect_block(blocks[3], 4, find(text, "<answer>"), static_cast<std::int64_t>(text.size()), 2,
               false);
}

TEST(information_is_opaque_and_keeps_the_round) {
  const std::string text = "<information><search>x</search><answer></information><mem>";
  const auto blocks = blocks_of(text);
  CHECK_EQ(blocks.size(), 2u);
  if (blocks.size() != 2u) return;
  expect_block(blocks[0], 5, 0, find(text, "<mem>"), 0, true);
  expect_block(blocks[1], 0, find(text, "<mem>"), static_cast<std::int64_t>(text.size()), 0,
               false);
  // Truncated tool output: the information block runs to the end.
  const auto cut = blocks_of("<search>q</search><information>abc</mem>");
  CHECK_EQ(cut.size(), 2u);
  if (cut.size() == 2u) {
    CHECK_EQ(cut[1].closed, false);
    CHECK_EQ(cut[1].round, 0);
  }
}

TEST(empty_and_marker_free_text) {
  CHECK(blocks_of("").empty());
  CHECK(blocks_of("no tags < here > at all </ >").empty());
}

TEST(token_mapping_straddling_and_zero_byte_tokens) {
  // ids:                 0      1      2       3      4       5     6    7      8
  const std::vector<std::string> vocab = {"<", "mem", ">a", "</mem", "><", "think>", "", "x", "b"};
  const auto scanner = make_scanner(vocab, false);
  // "<mem>a</mem><think>x" with a zero-byte token inside the think block and at both ends.
  const auto out = scan_one(scanner, {6, 0, 1, 2, 3, 4, 5, 6, 7, 6});
  CHECK_EQ(out.tag.size(), 2u);
  if (out.tag.size() != 2u) return;
  // mem: tokens "<" .. "><" (the straddling token belongs to both spans); the leading zero-byte
  // token does not start it.
  CHECK_EQ(out.tag[0], 0);
  CHECK_EQ(out.start[0], 1);
  CHECK_EQ(out.end[0], 6);
  CHECK_EQ(out.closed[0], 1);
  // think: starts at the straddling token, runs unclosed to "x"; the trailing zero-byte token
  // does not end it, the inner one sits inside.
  CHECK_EQ(out.tag[1], 1);
  CHECK_EQ(out.start[1], 5);
  CHECK_EQ(out.end[1], 9);
  CHECK_EQ(out.closed[1], 0);
}

TEST(token_path_equals_byte_path) {
  // Markers as whole tokens, markers split over tokens, tokens holding '<' in other ways, tokens
  // holding two markers or a marker plus text, zero-byte tokens.
  std::vector<std::string> vocab = {
      "hello", " ", "\n", "", "<", "mem", ">", "</", "a<b", "x>", "><", "</mem><think>", "a<mem",
      "e>b", "<info", "rmation>", "</th", "ink>", "q</search>\n", "<<", "<answer>42</answer>"};
  const auto first_marker_id = static_cast<std::int64_t>(vocab.size());
  for (int tag = 0; tag < kNumTags; ++tag) {
    vocab.push_back(marker_string(tag, false));
    vocab.push_back(marker_string(tag, true));
  }
  const auto tokens = make_scanner(vocab, true);
  const auto bytes = make_scanner(vocab, false);
  CHECK(tokens.token_path());
  CHECK(!bytes.token_path());
  for (int code = 0; code < kNumMarkers; ++code) {
    CHECK_EQ(tokens.marker_token_ids()[static_cast<std::size_t>(code)], first_marker_id + code);
  }
  std::mt19937_64 rng(1234);
  const auto vocab_size = static_cast<std::int64_t>(vocab.size());
  for (int trial = 0; trial < 5000; ++trial) {
    std::vector<std::int64_t> ids(rng() % 40);
    // A third of the trials use only plain and whole-marker tokens (ids only, no byte matching).
    const bool ids_only = trial % 3 == 0;
    for (auto& id : ids) {
      if (ids_only) {
        const std::int64_t plain[] = {0, 1, 2, 3, 5, 6, 9};
        id = (rng() % 3 == 0) ? plain[rng() % 7]
                              : first_marker_id + static_cast<std::int64_t>(rng() % 12);
      } else {
        id = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(vocab_size + 2)) - 1;
      }
    }
    const auto a = scan_one(tokens, ids);
    const auto b = scan_one(bytes, ids);
    CHECK(same(a, b));
    if (!same(a, b)) {
      std::fprintf(stderr, "  differing trial %d\n", trial);
      return;
    }
  }
}

TEST(token_path_matches_markers_across_tokens) {
  // ids:                 0      1      2       3      4       5     6    7      8
  const std::vector<std::string> vocab = {"<", "mem", ">a", "</mem", "><", "think>", "", "x", "b"};
  const auto scanner = make_scanner(vocab, true);
  const auto out = scan_one(scanner, {6, 0, 1, 2, 3, 4, 5, 6, 7, 6});
  CHECK_EQ(out.tag.size(), 2u);
  if (out.tag.size() != 2u) return;
  CHECK_EQ(out.start[0], 1);
  CHECK_EQ(out.end[0], 6);
  CHECK_EQ(out.start[1], 5);
  CHECK_EQ(out.end[1], 9);
  // A block cut by a marker starting at byte 0 of a token ends before the zero-byte tokens in
  // front of that token; one starting inside a token includes that token.
  const auto cut_at_token = make_scanner({"<mem>", "a", "", "<think>", "b<think>"}, true);
  const auto first = scan_one(cut_at_token, {0, 1, 2, 2, 3});
  CHECK_EQ(first.end[0], 2);
  const auto second = scan_one(cut_at_token, {0, 1, 2, 4});
  CHECK_EQ(second.end[0], 4);
  CHECK_EQ(second.start[1], 3);
}

TEST(out_of_vocabulary_ids_are_zero_byte_tokens) {
  const auto scanner = make_scanner({"<mem>", "a", "</mem>"}, true);
  const std::int64_t huge = INT64_MAX;
  const auto out = scan_one(scanner, {-1, 0, huge, 1, INT64_MIN, 2, 3, -7});
  CHECK_EQ(out.tag.size(), 1u);
  if (out.tag.size() == 1u) {
    CHECK_EQ(out.start[0], 1);
    CHECK_EQ(out.end[0], 6);
    CHECK_EQ(out.closed[0], 1);
  }
  const auto bytes_path = make_scanner({"<mem>", "a", "</mem>"}, false);  // vs the token path
  CHECK(same(out, scan_one(bytes_path, {-1, 0, huge, 1, INT64_MIN, 2, 3, -7})));

  // The first out-of-vocabulary id is reported by its flat index, on both paths.
  const std::vector<std::int64_t> ids = {0, 1, 2, 1, 3, -1};
  const std::int64_t offsets[4] = {0, 3, 3, 6};
  for (const SpanScanner* path : {&scanner, &bytes_path}) {
    SpanArrays spans;
    std::int64_t first_bad = 123;
    path->scan(ids.data(), 6, offsets, 3, spans, &first_bad);
    CHECK_EQ(first_bad, 4);
    path->scan(ids.data(), 3, offsets, 1, spans, &first_bad);
    CHECK_EQ(first_bad, -1);
  }
}

TEST(batches_empty_sequences_and_bad_offsets) {
  const auto scanner = make_scanner({"<mem>", "a", "</mem>"}, false);
  SpanArrays out;
  const std::int64_t zero[1] = {0};
  scanner.scan(nullptr, 0, zero, 0, out);
  CHECK_EQ(out.seq_offsets.size(), 1u);
  CHECK(out.tag.empty());

  const std::vector<std::int64_t> ids = {0, 1, 2, 0, 1};
  const std::int64_t offsets[5] = {0, 0, 3, 3, 5};
  scanner.scan(ids.data(), 5, offsets, 4, out);
  CHECK(out.seq_offsets == (std::vector<std::int64_t>{0, 0, 1, 1, 2}));
  CHECK_EQ(out.closed[0], 1);
  CHECK_EQ(out.closed[1], 0);
  CHECK_EQ(out.start[1], 0);
  CHECK_EQ(out.end[1], 2);

  const std::int64_t bad_first[2] = {1, 5};
  CHECK(throws_invalid_argument([&] { scanner.scan(ids.data(), 5, bad_first, 1, out); },
                                "seq_offsets[0]"));
  const std::int64_t decreasing[3] = {0, 4, 2};
  CHECK(throws_invalid_argument([&] { scanner.scan(ids.data(), 5, decreasing, 2, out); },
                                "non-decreasing"));
  const std::int64_t short_last[2] = {0, 4};
  CHECK(throws_invalid_argument([&] { scanner.scan(ids.data(), 5, short_last, 1, out); },
                                "seq_offsets[-1]"));
  const std::int64_t long_last[2] = {0, 6};
  CHECK(throws_invalid_argument([&] { scanner.scan(ids.data(), 5, long_last, 1, out); },
                                "seq_offsets[-1]"));
}

TEST(bad_token_tables_are_rejected) {
  CHECK(throws_invalid_argument([] { SpanScanner({}, {}, false); }, "empty"));
  CHECK(throws_invalid_argument([] { SpanScanner({'a'}, {1, 1}, false); }, "token_offsets[0]"));
  CHECK(throws_invalid_argument([] { SpanScanner({'a', 'b'}, {0, 2, 1}, false); },
                                "non-decreasing"));
  CHECK(throws_invalid_argument([] { SpanScanner({'a', 'b'}, {0, 1}, false); },
                                "token_offsets[-1]"));
  const SpanScanner empty_vocab({}, {0}, true);
  CHECK_EQ(empty_vocab.vocab_size(), 0);
  CHECK(scan_one(empty_vocab, {0, 1, -1}).tag.empty());
}

// The JSON tool-call table of mempo.protocol.tags.JSON_TAG_SET (Hermes / Qwen tool calls).
const TagTable& json_tags() {
  static const TagTable table({"mem", "think", "tool_call", "answer", "tool_response"}, {2, 3}, 4);
  return table;
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

TEST(json_table_markers_match_and_default_markers_do_not) {
  const TagTable& tags = json_tags();
  CHECK_EQ(tags.num_tags(), 5);
  CHECK_EQ(tags.max_marker_bytes(), std::string("</tool_response>").size());
  CHECK(tags.is_action(2) && tags.is_action(3) && !tags.is_action(0) && !tags.is_action(4));
  for (int code = 0; code < tags.num_markers(); ++code) {
    const std::string padded = tags.marker(code) + "{";
    const auto m =
        match_marker(tags, reinterpret_cast<const std::uint8_t*>(padded.data()), padded.size());
    CHECK_EQ(m.tag, code / 2);
    CHECK_EQ(m.closing, (code & 1) != 0);
    CHECK_EQ(m.length, tags.marker(code).size());
  }
  for (const char* miss : {"<search>", "</information>", "<tool>", "<tool_calls>", "<tool_call",
                           "<Tool_call>", "</tool_response", "<tool_response >"}) {
    const auto m =
        match_marker(tags, reinterpret_cast<const std::uint8_t*>(miss), std::strlen(miss));
    CHECK_EQ(m.length, 0u);
  }
}

TEST(json_tool_call_trajectory) {
  const std::string text =
      "<mem></mem><think>look it up</think>"
      "<tool_call>{\"name\": \"lookup\", \"arguments\": {\"key\": \"a<b\"}}</tool_call>"
      "<tool_response>7 <answer>not a tag</answer> <tool_call></tool_response>"
      "<mem>a is 7</mem><think>done</think><answer>7</answer><search>x</search>";
  std::vector<Block> blocks;
  scan_text(json_tags(), reinterpret_cast<const std::uint8_t*>(text.data()), text.size(), blocks);
  CHECK_EQ(blocks.size(), 7u);
  if (blocks.size() != 7u) return;
  expect_block(blocks[2], 2, find(text, "<tool_call>"),
               find(text, "</tool_call>") + static_cast<std::int64_t>(std::strlen("</tool_call>")),
               0, true);
  // The tool response is opaque (its markers are content) and belongs to the call's round.
  expect_block(blocks[3], 4, find(text, "<tool_response>"),
               find(text, "</tool_response>") + 16, 0, true);
  CHECK_EQ(blocks[4].round, 1);
  expect_block(blocks[6], 3, find(text, "<answer>7"),
               find(text, "</answer><search>") + 9, 1, true);  // <search> is no marker here
}

TEST(json_table_token_path_equals_byte_path) {
  std::vector<std::string> vocab = {"{\"", "name", "\": \"", "lookup", "\"}}", "<", "tool",
                                    "_call", ">", "</", "tool_response>", "<tool_", "response",
                                    "><", "\n", "", "a<b", "x", "call>", "<mem>", "</mem><think>"};
  const auto first_marker_id = static_cast<std::int64_t>(vocab.size());
  for (int code = 0; code < json_tags().num_markers(); ++code) {
    vocab.push_back(json_tags().marker(code));
  }
  const auto tokens = make_scanner(vocab, true, json_tags());
  const auto bytes = make_scanner(vocab, false, json_tags());
  CHECK_EQ(tokens.marker_token_ids().size(), 10u);
  CHECK_EQ(tokens.marker_token_ids()[0], 19);  // "<mem>" is a vocabulary entry before the markers
  CHECK_EQ(tokens.marker_token_ids()[5], first_marker_id + 5);
  std::mt19937_64 rng(4321);
  const auto vocab_size = static_cast<std::int64_t>(vocab.size());
  int spans = 0;
  for (int trial = 0; trial < 5000; ++trial) {
    std::vector<std::int64_t> ids(rng() % 40);
    for (auto& id : ids) {
      id = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(vocab_size + 2)) - 1;
    }
    const auto a = scan_one(tokens, ids);
    const auto b = scan_one(bytes, ids);
    spans += static_cast<int>(a.tag.size());
    CHECK(same(a, b));
    if (!same(a, b)) {
      std::fprintf(stderr, "  differing trial %d\n", trial);
      return;
    }
  }
  CHECK(spans > 5000);
}

TEST(bad_tag_tables_are_rejected) {
  CHECK(throws_invalid_argument([] { TagTable({}, {}, -1); }, "1 to"));
  CHECK(throws_invalid_argument([] { TagTable({"a", ""}, {}, -1); }, "tag name 1"));
  CHECK(throws_invalid_argument([] { TagTable({"a<b"}, {}, -1); }, "may only hold"));
  CHECK(throws_invalid_argument([] { TagTable({"a b"}, {}, -1); }, "may only hold"));
  CHECK(throws_invalid_argument([] { TagTable({"/a"}, {}, -1); }, "may only hold"));
  CHECK(throws_invalid_argument([] { TagTable({"a", "a"}, {}, -1); }, "repeated"));
  CHECK(throws_invalid_argument([] { TagTable({std::string(kMaxNameBytes + 1, 'x')}, {}, -1); },
                                "bytes"));
  CHECK(throws_invalid_argument([] { TagTable({"a"}, {1}, -1); }, "action tag code 1"));
  CHECK(throws_invalid_argument([] { TagTable({"a"}, {}, 1); }, "opaque tag code 1"));
  CHECK(throws_invalid_argument([] { TagTable({"a"}, {0}, 0); }, "cannot be an action"));
  // The longest name is accepted, and a marker that long is matched across tokens.
  const std::string longest(kMaxNameBytes, 'z');
  const TagTable table({longest, "k"}, {1}, -1);
  const auto scanner = make_scanner({"<", longest, ">", "x", "</" + longest + ">"}, true, table);
  const auto out = scan_one(scanner, {0, 1, 2, 3, 4});
  CHECK_EQ(out.tag.size(), 1u);
  if (out.tag.size() == 1u) {
    CHECK_EQ(out.start[0], 0);
    CHECK_EQ(out.end[0], 5);
    CHECK_EQ(out.closed[0], 1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const char* filter = argc > 1 ? argv[1] : nullptr;
  int run = 0;
  for (const auto& test : registry()) {
    if (filter != nullptr && std::strstr(test.name, filter) == nullptr) continue;
    const int before = g_failures;
    try {
      test.body();
    } catch (const std::exception& err) {
      std::fprintf(stderr, "  unexpected exception: %s\n", err.what());
      ++g_failures;
    }
    std::printf("%s %s\n", g_failures == before ? "PASS" : "FAIL", test.name);
    ++run;
  }
  std::printf("%d tests, %d failed checks\n", run, g_failures);
  return g_failures == 0 && run > 0 ? 0 : 1;
}
