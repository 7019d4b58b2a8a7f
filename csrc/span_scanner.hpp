// Tag-span scanner for MemPO trajectories: pure C++17, no Python, no torch.
//
// Conventions (shared with mempo/ops/spans.py, whose module docstring states the grammar in full):
//   * Tag code = index into kTagNames: 0 mem, 1 think, 2 search, 3 access, 4 answer, 5 information.
//   * Marker code = 2 * tag + (closing ? 1 : 0); the 12 markers are the exact byte strings "<name>"
//     and "</name>" (case-sensitive, no attributes, no spaces).
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

inline constexpr int kNumTags = 6;
inline constexpr int kInformationTag = 5;
inline constexpr int kNumMarkers = 2 * kNumTags;
inline constexpr std::array<std::string_view, kNumTags> kTagNames = {
    "mem", "think", "search", "access", "answer", "information"};

// search, access and answer are the actions that finish a round.
constexpr bool is_action_tag(int tag) noexcept { return tag >= 2 && tag <= 4; }

// The marker text for a tag, e.g. marker_string(0, true) == "</mem>".
std::string marker_string(int tag, bool closing);

struct MarkerMatch {
  int tag = -1;         // tag code, -1 when no marker starts here
  bool closing = false;
  std::size_t length = 0;  // bytes of the marker, 0 when no marker starts here
};

// Matches a marker starting exactly at text[0]; reads at most `available` bytes.
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
  // Feeds one marker found at [begin, end); appends to `out` every block this marker ends.
  void on_marker(int tag, bool closing, std::int64_t begin, std::int64_t end,
                 std::vector<Block>& out);
  // End of text at `text_end`: a block still open ends there, unclosed.
  void finish(std::int64_t text_end, std::vector<Block>& out);

 private:
  int open_tag_ = -1;
  std::int64_t open_begin_ = 0;
  std::int64_t open_round_ = 0;
  std::int64_t round_ = 0;
  bool round_has_action_ = false;
};

// Runs the grammar over one byte string; blocks come back in byte coordinates, in order of begin.
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

// Holds one tokenizer's token table; scan() maps a batch of id sequences to token spans.
// scan() is const and keeps its scratch buffers local, so one scanner may serve several threads.
class SpanScanner {
 public:
  // Throws std::invalid_argument unless token_offsets is non-empty, starts at 0, is
  // non-decreasing and ends at token_bytes.size().
  // token_path: scan token by token (see scan()); false: concatenate and scan every byte.
  SpanScanner(std::vector<std::uint8_t> token_bytes, std::vector<std::int64_t> token_offsets,
              bool token_path);

  std::int64_t vocab_size() const noexcept {
    return static_cast<std::int64_t>(token_offsets_.size()) - 1;
  }
  bool token_path() const noexcept { return token_path_; }
  // Per marker code, the smallest id whose bytes are exactly that marker, or -1.
  const std::array<std::int64_t, kNumMarkers>& marker_token_ids() const noexcept {
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
  // for at most 13 bytes. When the markers are single added tokens and no other token can start
  // one, the scan reads ids only.
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

  // Up to 14 bytes ("</information>" is the longest marker) of a sequence, from byte `offset` of
  // token `token` on, gathered across token boundaries; segment_end[s] is where (in window bytes)
  // the part taken from token segment_token[s] ends.
  struct MarkerWindow {
    static constexpr std::size_t kCapacity = 14;
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
  std::array<std::int64_t, kNumMarkers> marker_token_ids_{};
  bool token_path_ = true;
};

}  // namespace mempo::scanner
