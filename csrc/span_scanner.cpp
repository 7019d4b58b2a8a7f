// Implementation of the tag-span scanner; conventions and grammar: span_scanner.hpp and the module
// docstring of mempo/ops/spans.py.
#include "span_scanner.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

namespace mempo::scanner {

namespace {

bool is_name_byte(unsigned char c) noexcept {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '.' || c == ':' || c == '-';
}

}  // namespace

TagTable::TagTable(std::vector<std::string> names, const std::vector<int>& action_tags,
                   int opaque_tag)
    : names_(std::move(names)), opaque_(opaque_tag) {
  if (names_.empty() || names_.size() > static_cast<std::size_t>(kMaxTags)) {
    throw std::invalid_argument("a tag table needs 1 to " + std::to_string(kMaxTags) +
                                " tags, got " + std::to_string(names_.size()));
  }
  for (std::size_t i = 0; i < names_.size(); ++i) {
    const std::string& name = names_[i];
    if (name.empty() || name.size() > kMaxNameBytes) {
      throw std::invalid_argument("tag name " + std::to_string(i) + " must have 1 to " +
                                  std::to_string(kMaxNameBytes) + " bytes, got " +
                                  std::to_string(name.size()));
    }
    for (const char c : name) {
      if (!is_name_byte(static_cast<unsigned char>(c))) {
        throw std::invalid_argument("tag name '" + name +
                                    "' may only hold the bytes [A-Za-z0-9_.:-]");
      }
    }
    for (std::size_t j = 0; j < i; ++j) {
      if (names_[j] == name) throw std::invalid_argument("tag name '" + name + "' is repeated");
    }
  }
  action_.assign(names_.size(), false);
  for (const int tag : action_tags) {
    if (tag < 0 || tag >= num_tags()) {
      throw std::invalid_argument("action tag code " + std::to_string(tag) + " is not in [0, " +
                                  std::to_string(num_tags()) + ")");
    }
    action_[static_cast<std::size_t>(tag)] = true;
  }
  if (opaque_ < -1 || opaque_ >= num_tags()) {
    throw std::invalid_argument("opaque tag code " + std::to_string(opaque_) +
                                " is neither -1 nor in [0, " + std::to_string(num_tags()) + ")");
  }
  if (opaque_ >= 0 && action_[static_cast<std::size_t>(opaque_)]) {
    throw std::invalid_argument("the opaque tag '" + names_[static_cast<std::size_t>(opaque_)] +
                                "' cannot be an action");
  }
  for (int tag = 0; tag < num_tags(); ++tag) {
    const std::string& name = names_[static_cast<std::size_t>(tag)];
    markers_.push_back("<" + name + ">");
    markers_.push_back("</" + name + ">");
    max_marker_ = std::max(max_marker_, name.size() + 3);
    const auto first = static_cast<unsigned char>(name[0]);
    first_byte_[first] = true;
    by_first_byte_[first].push_back(tag);
  }
}

const TagTable& TagTable::mempo_default() {
  static const TagTable table(std::vector<std::string>(kTagNames.begin(), kTagNames.end()),
                              {2, 3, 4}, kInformationTag);
  return table;
}

std::string marker_string(int tag, bool closing) {
  if (tag < 0 || tag >= kNumTags) throw std::invalid_argument("tag code out of range");
  return TagTable::mempo_default().marker(2 * tag + (closing ? 1 : 0));
}

MarkerMatch match_marker(const TagTable& tags, const std::uint8_t* text,
                         std::size_t available) noexcept {
  MarkerMatch none;
  // "<x>" is the shortest possible marker.
  if (available < 3 || text[0] != '<') return none;
  std::size_t name_at = 1;
  bool closing = false;
  if (text[1] == '/') {
    closing = true;
    name_at = 2;
  }
  if (name_at >= available) return none;
  // The first letter of the name picks the candidate tags.
  for (const int tag : tags.tags_starting_with(text[name_at])) {
    const std::string& name = tags.name(tag);
    const std::size_t length = name_at + name.size() + 1;
    if (available < length) continue;
    if (std::memcmp(text + name_at, name.data(), name.size()) != 0) continue;
    if (text[name_at + name.size()] != '>') continue;
    return MarkerMatch{tag, closing, length};
  }
  return none;
}

MarkerMatch match_marker(const std::uint8_t* text, std::size_t available) noexcept {
  return match_marker(TagTable::mempo_default(), text, available);
}

void BlockParser::on_marker(int tag, bool closing, std::int64_t begin, std::int64_t end,
                            std::vector<Block>& out) {
  const int opaque = tags_->opaque_tag();
  if (open_tag_ >= 0 && open_tag_ == opaque) {
    // Tool output is opaque: inside it (<information>) only its own closing marker means anything.
    if (closing && tag == opaque) {
      out.push_back(Block{opaque, open_round_, open_begin_, end, true});
      open_tag_ = -1;
    }
    return;
  }
  if (closing) {
    if (tag == open_tag_) {
      out.push_back(Block{tag, open_round_, open_begin_, end, true});
      open_tag_ = -1;
    }
    // Otherwise a stray closing marker: ignored.
    return;
  }
  if (open_tag_ >= 0) {
    // A new opening marker while a block is open: the open block lost its closing marker.
    out.push_back(Block{open_tag_, open_round_, open_begin_, begin, false});
  }
  // The opaque tag (<information>) answers the action of the current round and never advances
  // the round count.
  if (tag != opaque) {
    if (round_has_action_) {
      ++round_;
      round_has_action_ = false;
    }
    if (tags_->is_action(tag)) round_has_action_ = true;
  }
  open_tag_ = tag;
  open_begin_ = begin;
  open_round_ = round_;
}

void BlockParser::finish(std::int64_t text_end, std::vector<Block>& out) {
  if (open_tag_ >= 0) {
    out.push_back(Block{open_tag_, open_round_, open_begin_, text_end, false});
    open_tag_ = -1;
  }
}

void scan_text(const std::uint8_t* text, std::size_t size, std::vector<Block>& out) {
  scan_text(TagTable::mempo_default(), text, size, out);
}

void scan_text(const TagTable& tags, const std::uint8_t* text, std::size_t size,
               std::vector<Block>& out) {
  BlockParser parser(tags);
  std::size_t pos = 0;
  while (pos < size) {
    const void* hit = std::memchr(text + pos, '<', size - pos);
    if (hit == nullptr) break;
    const std::size_t at = static_cast<std::size_t>(static_cast<const std::uint8_t*>(hit) - text);
    const MarkerMatch marker = match_marker(tags, text + at, size - at);
    if (marker.length == 0) {
      pos = at + 1;
      continue;
    }
    parser.on_marker(marker.tag, marker.closing, static_cast<std::int64_t>(at),
                     static_cast<std::int64_t>(at + marker.length), out);
    // A marker holds a single '<' (its first byte), so markers never overlap.
    pos = at + marker.length;
  }
  parser.finish(static_cast<std::int64_t>(size), out);
}

namespace {

// True when some '<' of the token starts a marker inside it, or starts a proper prefix of a
// marker that ends the token (so the marker may continue in the next tokens).
bool may_start_marker(const TagTable& tags, const std::uint8_t* bytes, std::size_t length) {
  for (std::size_t k = 0; k < length; ++k) {
    if (bytes[k] != '<') continue;
    if (match_marker(tags, bytes + k, length - k).length > 0) return true;
    const std::size_t rest = length - k;
    for (int code = 0; code < tags.num_markers(); ++code) {
      const std::string& marker = tags.marker(code);
      if (rest < marker.size() && std::memcmp(marker.data(), bytes + k, rest) == 0) return true;
    }
  }
  return false;
}

}  // namespace

SpanScanner::SpanScanner(std::vector<std::uint8_t> token_bytes,
                         std::vector<std::int64_t> token_offsets, bool token_path, TagTable tags)
    : token_bytes_(std::move(token_bytes)),
      token_offsets_(std::move(token_offsets)),
      tags_(std::move(tags)),
      token_path_(token_path) {
  if (token_offsets_.empty()) {
    throw std::invalid_argument("token_offsets must have V+1 >= 1 entries, got an empty array");
  }
  if (token_offsets_.front() != 0) {
    throw std::invalid_argument("token_offsets[0] must be 0, got " +
                                std::to_string(token_offsets_.front()));
  }
  for (std::size_t i = 0; i + 1 < token_offsets_.size(); ++i) {
    if (token_offsets_[i + 1] < token_offsets_[i]) {
      throw std::invalid_argument("token_offsets must be non-decreasing: token_offsets[" +
                                  std::to_string(i) + "]=" + std::to_string(token_offsets_[i]) +
                                  " > token_offsets[" + std::to_string(i + 1) +
                                  "]=" + std::to_string(token_offsets_[i + 1]));
    }
  }
  if (token_offsets_.back() != static_cast<std::int64_t>(token_bytes_.size())) {
    throw std::invalid_argument("token_offsets[-1] must equal the number of token bytes (" +
                                std::to_string(token_bytes_.size()) + "), got " +
                                std::to_string(token_offsets_.back()));
  }

  marker_token_ids_.assign(static_cast<std::size_t>(tags_.num_markers()), -1);
  const std::int64_t vocab = vocab_size();
  token_class_.assign(static_cast<std::size_t>(vocab), kPlainToken);
  for (std::int64_t id = 0; id < vocab; ++id) {
    const std::int64_t length = token_length(id);
    if (length == 0) continue;
    const std::uint8_t* bytes = token_bytes_.data() + token_offsets_[static_cast<std::size_t>(id)];
    if (std::memchr(bytes, '<', static_cast<std::size_t>(length)) == nullptr) continue;
    const MarkerMatch marker = match_marker(tags_, bytes, static_cast<std::size_t>(length));
    if (marker.length == static_cast<std::size_t>(length)) {
      const int code = 2 * marker.tag + (marker.closing ? 1 : 0);
      token_class_[static_cast<std::size_t>(id)] =
          static_cast<std::uint8_t>(kMarkerTokenBase + code);
      if (marker_token_ids_[static_cast<std::size_t>(code)] < 0) {
        marker_token_ids_[static_cast<std::size_t>(code)] = id;
      }
    } else if (may_start_marker(tags_, bytes, static_cast<std::size_t>(length))) {
      token_class_[static_cast<std::size_t>(id)] = kMayStartMarker;
    }
    // Otherwise every '<' of the token is followed, inside the token, by bytes no marker has
    // there ("<b", " <=", "<div>"): no marker can start in it, so it is scanned as plain.
  }
}

std::int64_t SpanScanner::token_length(std::int64_t id) const noexcept {
  if (id < 0 || id >= vocab_size()) return 0;
  const auto at = static_cast<std::size_t>(id);
  return token_offsets_[at + 1] - token_offsets_[at];
}

void SpanScanner::append(SpanArrays& out, const Block& block, std::int64_t start,
                         std::int64_t end) {
  out.tag.push_back(block.tag);
  out.start.push_back(start);
  out.end.push_back(end);
  out.round.push_back(block.round);
  out.closed.push_back(block.closed ? 1 : 0);
}

int SpanScanner::peek_byte(const std::int64_t* ids, std::int64_t n, std::int64_t token,
                           std::size_t offset) const noexcept {
  for (; token < n; ++token) {
    const auto length = static_cast<std::size_t>(token_length(ids[token]));
    if (offset < length) {
      const auto id = static_cast<std::size_t>(ids[token]);  // in range: its length is > 0
      return token_bytes_[static_cast<std::size_t>(token_offsets_[id]) + offset];
    }
    offset -= length;
  }
  return -1;
}

void SpanScanner::fill_window(MarkerWindow& window, const std::int64_t* ids, std::int64_t n,
                              std::size_t want) const {
  while (window.filled < want && window.token < n) {
    const std::int64_t id = ids[window.token];
    const auto length = static_cast<std::size_t>(token_length(id));
    if (window.offset >= length) {  // this token is used up (or has no bytes): next one
      ++window.token;
      window.offset = 0;
      continue;
    }
    const std::size_t take = std::min(length - window.offset, want - window.filled);
    std::memcpy(window.bytes + window.filled,
                token_bytes_.data() + token_offsets_[static_cast<std::size_t>(id)] + window.offset,
                take);
    window.filled += take;
    window.offset += take;
    if (window.segments > 0 && window.segment_token[window.segments - 1] == window.token) {
      window.segment_end[window.segments - 1] = window.filled;
    } else {
      window.segment_token[window.segments] = window.token;
      window.segment_end[window.segments++] = window.filled;
    }
  }
}

std::int64_t SpanScanner::scan_tokens(const std::int64_t* ids, std::int64_t n, Workspace& ws,
                                      SpanArrays& out) const {
  // Marker positions are handed to the parser as token coordinates:
  //   begin = 2 * i + (k > 0) for a marker starting at byte k of token i. The span starts at
  //           token i (the token holding the '<'); when such a marker cuts an open block, that
  //           block's end is token i if k > 0 (token i starts before the cut), else the last
  //           token of non-zero length before i.
  //   end   = j + 1 for a closing marker whose last byte lies in token j.
  const std::int64_t vocab = vocab_size();
  std::int64_t first_out_of_vocab = -1;
  ws.blocks.clear();
  BlockParser parser(tags_);
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t id = ids[i];
    if (id < 0 || id >= vocab) {  // a zero-byte token
      if (first_out_of_vocab < 0) first_out_of_vocab = i;
      continue;
    }
    const std::uint8_t cls = token_class_[static_cast<std::size_t>(id)];
    if (cls == kPlainToken) continue;
    if (cls >= kMarkerTokenBase) {
      const int code = cls - kMarkerTokenBase;
      parser.on_marker(code / 2, (code & 1) != 0, 2 * i, i + 1, ws.blocks);
      continue;
    }
    // A token that may start a marker but is not exactly one: try a match at each of its '<'.
    const std::uint8_t* bytes = token_bytes_.data() + token_offsets_[static_cast<std::size_t>(id)];
    const auto length = static_cast<std::size_t>(token_length(id));
    for (std::size_t k = 0; k < length;) {
      // Tokens are a few bytes long: a plain loop beats a memchr call here.
      while (k < length && bytes[k] != '<') ++k;
      if (k == length) break;
      // Cheap rejection first (" < ", "<b", "</p>", "<="): a marker's name starts right after
      // "<" or "</" with one of the first letters of the table's names.
      const int after_lt = peek_byte(ids, n, i, k + 1);
      const int name_first = after_lt == '/' ? peek_byte(ids, n, i, k + 2) : after_lt;
      if (name_first < 0 || !tags_.name_may_start_with(static_cast<std::uint8_t>(name_first))) {
        ++k;
        continue;
      }
      // The bytes from this '<' on, read on into the next tokens as far as needed.
      MarkerWindow window(i, k);
      fill_window(window, ids, n, tags_.max_marker_bytes());
      const MarkerMatch marker = match_marker(tags_, window.bytes, window.filled);
      if (marker.length == 0) {
        ++k;
        continue;
      }
      std::size_t s = 0;
      while (window.segment_end[s] < marker.length) ++s;  // the part holding the marker's end
      const std::int64_t last_token = window.segment_token[s];
      parser.on_marker(marker.tag, marker.closing, 2 * i + (k > 0 ? 1 : 0), last_token + 1,
                       ws.blocks);
      // A marker that runs into later tokens covers the rest of this one (k passes its end); those
      // later tokens hold no '<' in the covered part (a marker has one '<'), so the outer loop
      // goes on with token i + 1 unchanged.
      k += marker.length;
    }
  }
  parser.finish(2 * n, ws.blocks);
  for (const Block& block : ws.blocks) {
    const std::int64_t start = block.begin / 2;
    std::int64_t end = block.end;
    if (!block.closed) {
      end = block.end / 2;
      if (block.end % 2 == 1) {
        end += 1;  // the cutting marker starts inside token end/2, which overlaps the block
      } else {
        // Zero-byte tokens just before the cut do not overlap the block.
        while (end - 1 > start && token_length(ids[end - 1]) == 0) --end;
      }
    }
    append(out, block, start, end);
  }
  return first_out_of_vocab;
}

std::int64_t SpanScanner::scan_bytes(const std::int64_t* ids, std::int64_t n, Workspace& ws,
                                     SpanArrays& out) const {
  const std::int64_t vocab = vocab_size();
  std::int64_t first_out_of_vocab = -1;
  ws.token_end.resize(static_cast<std::size_t>(n));
  std::int64_t total = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    if (first_out_of_vocab < 0 && (ids[i] < 0 || ids[i] >= vocab)) first_out_of_vocab = i;
    total += token_length(ids[i]);
    ws.token_end[static_cast<std::size_t>(i)] = total;
  }
  ws.text.resize(static_cast<std::size_t>(total));
  std::uint8_t* dst = ws.text.data();
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t length = token_length(ids[i]);
    if (length == 0) continue;
    std::memcpy(dst, token_bytes_.data() + token_offsets_[static_cast<std::size_t>(ids[i])],
                static_cast<std::size_t>(length));
    dst += length;
  }
  ws.blocks.clear();
  scan_text(tags_, ws.text.data(), ws.text.size(), ws.blocks);

  // A token belongs to a span when its bytes overlap the span's bytes. token_end is sorted, and
  // token i covers [token_end[i-1], token_end[i]).
  const auto ends_begin = ws.token_end.begin();
  const auto ends_end = ws.token_end.end();
  for (const Block& block : ws.blocks) {
    // First token whose bytes end after the span's first byte (skips zero-byte tokens).
    const std::int64_t start = std::upper_bound(ends_begin, ends_end, block.begin) - ends_begin;
    // One past the last token whose bytes start before the span's end: token 0 starts at 0,
    // token i > 0 starts at token_end[i-1].
    const std::int64_t end = (std::lower_bound(ends_begin, ends_end, block.end) - ends_begin) + 1;
    append(out, block, start, end);
  }
  return first_out_of_vocab;
}

void SpanScanner::scan(const std::int64_t* ids, std::int64_t num_ids,
                       const std::int64_t* seq_offsets, std::int64_t num_seqs,
                       SpanArrays& out, std::int64_t* first_out_of_vocab) const {
  if (num_ids < 0) throw std::invalid_argument("num_ids must be >= 0");
  if (num_seqs < 0) throw std::invalid_argument("num_seqs must be >= 0");
  if (seq_offsets[0] != 0) {
    throw std::invalid_argument("seq_offsets[0] must be 0, got " + std::to_string(seq_offsets[0]));
  }
  for (std::int64_t i = 0; i < num_seqs; ++i) {
    if (seq_offsets[i + 1] < seq_offsets[i]) {
      throw std::invalid_argument(
          "seq_offsets must be non-decreasing: seq_offsets[" + std::to_string(i) +
          "]=" + std::to_string(seq_offsets[i]) + " > seq_offsets[" + std::to_string(i + 1) +
          "]=" + std::to_string(seq_offsets[i + 1]));
    }
  }
  if (seq_offsets[num_seqs] != num_ids) {
    throw std::invalid_argument("seq_offsets[-1] must equal the number of ids (" +
                                std::to_string(num_ids) + "), got " +
                                std::to_string(seq_offsets[num_seqs]));
  }

  out.seq_offsets.assign(static_cast<std::size_t>(num_seqs) + 1, 0);
  out.tag.clear();
  out.start.clear();
  out.end.clear();
  out.round.clear();
  out.closed.clear();
  if (first_out_of_vocab != nullptr) *first_out_of_vocab = -1;
  Workspace ws;
  for (std::int64_t i = 0; i < num_seqs; ++i) {
    const std::int64_t* seq = ids + seq_offsets[i];
    const std::int64_t n = seq_offsets[i + 1] - seq_offsets[i];
    if (n > 0) {
      const std::int64_t bad =
          token_path_ ? scan_tokens(seq, n, ws, out) : scan_bytes(seq, n, ws, out);
      if (bad >= 0 && first_out_of_vocab != nullptr && *first_out_of_vocab < 0) {
        *first_out_of_vocab = seq_offsets[i] + bad;
      }
    }
    out.seq_offsets[static_cast<std::size_t>(i) + 1] = static_cast<std::int64_t>(out.tag.size());
  }
}

}  // namespace mempo::scanner
