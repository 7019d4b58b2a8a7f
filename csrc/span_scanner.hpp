// Tag-span scanner for MemPO trajectories: pure C++17, no Python, no torch.
//
// Conventions (shared with mempo/ops/spans.py, whose module docstring states the grammar in full):
//   * The tags come from a TagTable given at run time (mempo.protocol.tags.TagSet on the Python
//     side): tag code = index into its names; some tags are *actions* (they finish a round) and at
//     most one is *opaque* (the tool result: inside it only its own closing marker counts).
//     TagTable::mempo_default() is the tags format: 0 mem, 1 think, 2 search, 3 access, 4 answer,
//     5 information (actions 2-4, opaque 5).
//   * Marker code = 2 * tag + (closing ? 1 : 0); the markers are the exact byte strings "<name>"
//     and "</name>" (case-sensitive, no attributes, no spaces). Names are 1 to kMaxNameBytes bytes
//     of [A-Za-z0-9_.:-], so every marker holds exactly one '<' (its first byte) and one '>' (its
//     last): markers never overlap and at most one starts at any byte.
//   * Token table (CSR): token id t has the bytes
//     token_bytes[token_offsets[t] .. token_offsets[t+1]).
//     V = token_offsets.size() - 1. Ids outside [0, V) are treated as zero-byte tokens (never a
//     crash); the Python layer rejects them before calling in.
//   * Batch (CSR): ids is one flat int64 array; sequence i is
//     ids[seq_offsets[i] .. seq_offsets[i+1]).
//   * Output spans are token-index ranges [start, end) relative to their own sequence, covering the
//     markers themselves; spans of a sequence are in order of start.
//   * Cost: the token path is one pass over the ids plus byte matching inside the few tokens that
//     hold '<'; the byte path is one memchr-driven pass over each sequence's concatenated bytes.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace mempo::scanner {

// The longest tag name, and so the longest marker ("</" + name + ">"), the table accepts.
inline constexpr std::size_t kMaxNameBytes = 48;
inline constexpr std::size_t kMaxMarkerBytes = kMaxNameBytes + 3;
inline constexpr int kMaxTags = 64;

// The default table's tag count and codes (the tags format).
inline constexpr int kNumTags = 6;
inline constexpr int kInformationTag = 5;
inline constexpr int kNumMarkers = 2 * kNumTags;
inline constexpr std::array<std::string_view, kNumTags> kTagNames = {
    "mem", "think", "search", "access", "answer", "information"};

// The tags a scanner finds: names (code = index), which are actions, which one is opaque.
class TagTable {
 public:
  // Throws std::invalid_argument unless there are 1..kMaxTags distinct names of 1..kMaxNameBytes
  // bytes of [A-Za-z0-9_.:-], every action code names a tag, and opaque is -1 or a tag code that
  // is no action.
  TagTable(std::vector<std::string> names, const std::vector<int>& action_tags, int opaque_tag);
  // mem, think, search, access, answer, information; actions search/access/answer; opaque
  // information.
  static const TagTable& mempo_default();

  int num_tags() const noexcept { return static_cast<int>(names_.size()); }
  int num_markers() const noexcept { return 2 * num_tags(); }
  const std::string& name(int tag) const { return names_.at(static_cast<std::size_t>(tag)); }
  bool is_action(int tag) const noexcept {
    return tag >= 0 && tag < num_tags() && action_[static_cast<std::size_t>(tag)];
  }
  int opaque_tag() const noexcept { return opaque_; }
  // The marker text of a marker code, e.g. marker(1) == "</mem>" in the default table.
  const std::string& marker(int code) const { return markers_.at(static_cast<std::size_t>(code)); }
  std::size_t max_marker_bytes() const noexcept { return max_marker_; }
  // Whether some tag name starts with this byte (the cheap rejection of a '<').
  bool name_may_start_with(std::uint8_t byte) const noexcept { return first_byte_[byte]; }
  // The tags whose names start with `byte`.
  const std::vector<int>& tags_starting_with(std::uint8_t byte) const noexcept {
    return by_first_byte_[byte];
  }

 private:
  std::vector<std::string> names_;
  std::vector<bool> action_;
  int opaque_ = -1;
  std::vector<std::string> markers_;
  std::size_t max_marker_ = 0;
  std::array<bool, 256> first_byte_{};
  std::array<std::vector<int>, 256> by_first_byte_{};
};

// The marker text for a tag of the default table, e.g. marker_string(0, true) == "</mem>".
std::string marker_string(int tag, bool closing);

struct MarkerMatch {
  int tag = -1;         // tag code, -1 when no marker starts here
  bool closing = false;
  std::size_t length = 0;  // bytes of the marker, 0 when no marker starts here
};

// Matches a marker of `tags` starting exactly at text[0]; reads at most `available` bytes.
MarkerMatch match_marker(const TagTable& tags, const std::uint8_t* text,
                         std::size_t available) noexcept;
// The same with the default table.
MarkerMatch match_marker(const std::uint8_t* text, std::size_t available) noexcept;

// One block as found by the grammar, in caller-chosen coordinates (bytes or tokens).
struct Block {
  int tag = -1;
  std::int64_t round = 0;
  std::int64_t begin = 0;  // coordinate where the opening marker begins
  std::int64_t end = 0;    // closed: where the closing marker ends; unclosed: where the text
                           // that cut it off begins (next opening marker, or end of text)
  bool closed = false;
};

// The block grammar as a state machine over a stream of markers; knows nothing about bytes or
// tokens, so the byte path and the token path share it.
class BlockParser {
 public:
  explicit BlockParser(const TagTable& tags) noexcept : tags_(&tags) {}
  // Feeds one marker found at [begin, end); appends to `out` every block this marker ends.
  void on_marker(int tag, bool closing, std::int64_t begin, std::int64_t end,
                 std::vector<Block>& out);
  // End of text at `text_end`: a block still open ends there, unclosed.
  void finish(std::int64_t text_end, std::vector<Block>& out);

 private:
  const TagTable* tags_;
  int open_tag_ = -1;
  std::int64_t open_begin_ = 0;
  std::int64_t open_round_ = 0;
  std::int64_t round_ = 0;
  bool round_has_action_ = false;
};

// Runs the grammar of `tags` over one byte string; blocks come back in byte coordinates, in order
// of begin.
void scan_text(const TagTable& tags, const std::uint8_t* text, std::size_t size,
               std::vector<Block>& out);
// The same with the default table.
void scan_text(const std::uint8_t* text, std::size_t size, std::vector<Block>& out);

// Structure-of-arrays result of SpanScanner::scan. seq_offsets has N+1 entries (CSR over spans);
// the other arrays have one entry per span. closed is 0/1.
struct SpanArrays {
  std::vector<std::int64_t> seq_offsets;
  std::vector<std::int64_t> tag;
  std::vector<std::int64_t> start;
  std::vector<std::int64_t> end;
  std::vector<std::int64_t> round;
  std::vector<std::uint8_t> closed;
};

// Holds one tokenizer's token table and one tag table; scan() maps a batch of id sequences to
// token spans.
// scan() is const and keeps its scratch buffers local, so one scanner may serve several threads.
class SpanScanner {
 public:
  // Throws std::invalid_argument unless token_offsets is non-empty, starts at 0, is
  // non-decreasing and ends at token_bytes.size().
  // token_path: scan token by token (see scan()); false: concatenate and scan every byte.
  SpanScanner(std::vector<std::uint8_t> token_bytes, std::vector<std::int64_t> token_offsets,
              bool token_path, TagTable tags = TagTable::mempo_default());

  std::int64_t vocab_size() const noexcept {
    return static_cast<std::int64_t>(token_offsets_.size()) - 1;
  }
  bool token_path() const noexcept { return token_path_; }
  const TagTable& tags() const noexcept { return tags_; }
  // Per marker code (2 * tags().num_tags() entries), the smallest id whose bytes are exactly that
  // marker, or -1.
  const std::vector<std::int64_t>& marker_token_ids() const noexcept {
    return marker_token_ids_;
  }
  // Byte length of a token; 0 for ids outside [0, V).
  std::int64_t token_length(std::int64_t id) const noexcept;

  // Scans num_seqs sequences of the flat `ids` (num_ids entries) delimited by seq_offsets
  // (num_seqs + 1 entries). Throws std::invalid_argument on malformed seq_offsets; any id value is
  // accepted (ids outside [0, V) are zero-byte tokens). Results replace the contents of `out`.
  // When first_out_of_vocab is given, it receives the flat index of the first id outside [0, V),
  // or -1 (found during the scan, at no extra pass).
  //
  // Both paths give identical results. The byte path concatenates each sequence's bytes and scans
  // them. The token path looks up a per-id class instead: every marker starts with '<' and holds
  // no other '<', so a token without '<' never starts a marker and a token that is exactly a
  // marker is that marker; only tokens with a '<' that can start a marker (one inside the token,
  // or a marker prefix ending the token) are matched byte-wise, reading on into the next tokens
  // for at most max_marker_bytes() - 1 bytes. When the markers are single added tokens and no
  // other token can start one, the scan reads ids only.
  void scan(const std::int64_t* ids, std::int64_t num_ids, const std::int64_t* seq_offsets,
            std::int64_t num_seqs, SpanArrays& out,
            std::int64_t* first_out_of_vocab = nullptr) const;

 private:
  // token_class_[id]: kPlainToken (no '<' that can start a marker), kMayStartMarker (holds a '<'
  // that can: a marker inside it, or a marker prefix at its end; not exactly a marker), or
  // kMarkerTokenBase + marker code.
  static constexpr std::uint8_t kPlainToken = 0;
  static constexpr std::uint8_t kMayStartMarker = 1;
  static constexpr std::uint8_t kMarkerTokenBase = 2;

  struct Workspace {
    std::vector<std::uint8_t> text;       // byte path: concatenated bytes of one sequence
    std::vector<std::int64_t> token_end;  // byte path: byte end of each token of that sequence
    std::vector<Block> blocks;
  };

  // Up to kMaxMarkerBytes bytes (the table's longest marker is read) of a sequence, from byte
  // `offset` of token `token` on, gathered across token boundaries; segment_end[s] is where (in
  // window bytes) the part taken from token segment_token[s] ends.
  struct MarkerWindow {
    static constexpr std::size_t kCapacity = kMaxMarkerBytes;
    MarkerWindow(std::int64_t first_token, std::size_t first_offset)
        : token(first_token), offset(first_offset) {}
    // Left uninitialised on purpose (this runs for every '<'); only [0, filled) and
    // [0, segments) are ever read.
    std::uint8_t bytes[kCapacity];
    std::int64_t segment_token[kCapacity];
    std::size_t segment_end[kCapacity];
    std::size_t filled = 0;
    std::size_t segments = 0;
    std::int64_t token;   // next token to read from
    std::size_t offset;   // next byte of that token
  };
  // The byte `offset` bytes after the start of token `token` of the sequence (reading on into
  // later tokens), or -1 past the end of the sequence.
  int peek_byte(const std::int64_t* ids, std::int64_t n, std::int64_t token,
                std::size_t offset) const noexcept;
  // Extends the window to `want` bytes (fewer at the end of the sequence).
  void fill_window(MarkerWindow& window, const std::int64_t* ids, std::int64_t n,
                   std::size_t want) const;
  // One sequence each; both return the index of its first id outside [0, V), or -1.
  std::int64_t scan_tokens(const std::int64_t* ids, std::int64_t n, Workspace& ws,
                           SpanArrays& out) const;
  std::int64_t scan_bytes(const std::int64_t* ids, std::int64_t n, Workspace& ws,
                          SpanArrays& out) const;
  static void append(SpanArrays& out, const Block& block, std::int64_t start, std::int64_t end);

  std::vector<std::uint8_t> token_bytes_;
  std::vector<std::int64_t> token_offsets_;
  std::vector<std::uint8_t> token_class_;
  TagTable tags_;
  std::vector<std::int64_t> marker_token_ids_;
  bool token_path_ = true;
};

}  // namespace mempo::scanner
