// pybind11 module mempo._scanner: numpy in, numpy out; no torch at build time.
//
// The public API is mempo/ops/spans.py, which validates inputs; this layer only checks what it
// must to stay memory-safe (array shapes, CSR offsets) and converts C++ exceptions to ValueError.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "span_scanner.hpp"

namespace py = pybind11;
using mempo::scanner::SpanArrays;
using mempo::scanner::SpanScanner;
using mempo::scanner::TagTable;

namespace {

using Int64Array = py::array_t<std::int64_t, py::array::c_style>;
using UInt8Array = py::array_t<std::uint8_t, py::array::c_style>;

template <class T>
py::array_t<T> to_numpy(std::vector<T>&& values) {
  // Hand the vector's buffer to numpy without copying; the capsule frees it with the array.
  auto* owned = new std::vector<T>(std::move(values));
  py::capsule free_when_done(owned, [](void* p) { delete static_cast<std::vector<T>*>(p); });
  return py::array_t<T>({static_cast<py::ssize_t>(owned->size())}, {sizeof(T)}, owned->data(),
                        free_when_done);
}

void require_1d(const py::array& array, const char* name) {
  if (array.ndim() != 1) {
    throw std::invalid_argument(std::string(name) + " must be 1-D, got " +
                                std::to_string(array.ndim()) + " dimensions");
  }
}

// The tag table of (tag_names, action_tags, opaque_tag); None for all three is the default table.
TagTable make_tags(const py::object& tag_names, const py::object& action_tags,
                   const py::object& opaque_tag) {
  if (tag_names.is_none() && action_tags.is_none() && opaque_tag.is_none()) {
    return TagTable::mempo_default();
  }
  if (tag_names.is_none() || action_tags.is_none() || opaque_tag.is_none()) {
    throw std::invalid_argument("give tag_names, action_tags and opaque_tag together, or none");
  }
  return TagTable(tag_names.cast<std::vector<std::string>>(), action_tags.cast<std::vector<int>>(),
                  opaque_tag.cast<int>());
}

SpanScanner make_scanner(const UInt8Array& token_bytes, const Int64Array& token_offsets,
                         bool token_path, const py::object& tag_names,
                         const py::object& action_tags, const py::object& opaque_tag) {
  require_1d(token_bytes, "token_bytes");
  require_1d(token_offsets, "token_offsets");
  TagTable tags = make_tags(tag_names, action_tags, opaque_tag);
  std::vector<std::uint8_t> bytes(token_bytes.data(), token_bytes.data() + token_bytes.size());
  std::vector<std::int64_t> offsets(token_offsets.data(),
                                    token_offsets.data() + token_offsets.size());
  return SpanScanner(std::move(bytes), std::move(offsets), token_path, std::move(tags));
}

py::tuple scan(const SpanScanner& scanner, const Int64Array& ids, const Int64Array& seq_offsets,
               bool reject_out_of_vocab) {
  require_1d(ids, "ids");
  require_1d(seq_offsets, "seq_offsets");
  if (seq_offsets.size() < 1) {
    throw std::invalid_argument("seq_offsets must have N+1 >= 1 entries, got an empty array");
  }
  const auto num_ids = static_cast<std::int64_t>(ids.size());
  const auto num_seqs = static_cast<std::int64_t>(seq_offsets.size()) - 1;
  SpanArrays spans;
  std::int64_t bad = -1;
  {
    py::gil_scoped_release no_gil;
    // scan() validates the offsets before it reports `bad`, so (sequence, position) below is
    // computed against well-formed offsets.
    scanner.scan(ids.data(), num_ids, seq_offsets.data(), num_seqs, spans, &bad);
  }
  if (!reject_out_of_vocab) bad = -1;
  if (bad >= 0) {
    const std::int64_t* offsets = seq_offsets.data();
    const std::int64_t sequence =
        (std::upper_bound(offsets, offsets + num_seqs + 1, bad) - offsets) - 1;
    throw std::invalid_argument(
        "token id " + std::to_string(ids.data()[bad]) + " at (sequence " +
        std::to_string(sequence) + ", position " + std::to_string(bad - offsets[sequence]) +
        ") is outside the vocabulary [0, " + std::to_string(scanner.vocab_size()) + ")");
  }
  return py::make_tuple(to_numpy(std::move(spans.seq_offsets)), to_numpy(std::move(spans.tag)),
                        to_numpy(std::move(spans.start)), to_numpy(std::move(spans.end)),
                        to_numpy(std::move(spans.round)), to_numpy(std::move(spans.closed)));
}

// Flattens a list/tuple of lists/tuples of Python ints into (flat int64 [T], offsets int64 [N+1])
// without a numpy round trip per sequence. Returns None (the caller falls back to numpy) as soon
// as anything is not an exact list/tuple of exact ints that fit int64; no Python code runs while
// the containers are read, so they cannot change underneath.
py::object flatten_int_sequences(const py::handle& sequences) {
  PyObject* outer = sequences.ptr();
  if (!PyList_CheckExact(outer) && !PyTuple_CheckExact(outer)) return py::none();
  const Py_ssize_t num_seqs = PySequence_Fast_GET_SIZE(outer);
  PyObject** seqs = PySequence_Fast_ITEMS(outer);
  py::array_t<std::int64_t> offsets(num_seqs + 1);
  std::int64_t* offset = offsets.mutable_data();
  offset[0] = 0;
  for (Py_ssize_t i = 0; i < num_seqs; ++i) {
    PyObject* seq = seqs[i];
    if (!PyList_CheckExact(seq) && !PyTuple_CheckExact(seq)) return py::none();
    offset[i + 1] = offset[i] + PySequence_Fast_GET_SIZE(seq);
  }
  py::array_t<std::int64_t> flat(offset[num_seqs]);
  std::int64_t* out = flat.mutable_data();
  for (Py_ssize_t i = 0; i < num_seqs; ++i) {
    PyObject* seq = seqs[i];
    const Py_ssize_t length = PySequence_Fast_GET_SIZE(seq);
    PyObject** items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t j = 0; j < length; ++j) {
      if (!PyLong_CheckExact(items[j])) return py::none();
      int overflow = 0;
      const long long value = PyLong_AsLongLongAndOverflow(items[j], &overflow);
      if (overflow != 0) return py::none();
      *out++ = static_cast<std::int64_t>(value);
    }
  }
  return py::make_tuple(flat, offsets);
}

py::list scan_text(const py::bytes& text, const py::object& tag_names,
                   const py::object& action_tags, const py::object& opaque_tag) {
  const TagTable tags = make_tags(tag_names, action_tags, opaque_tag);
  const std::string_view view(text);
  std::vector<mempo::scanner::Block> blocks;
  mempo::scanner::scan_text(tags, reinterpret_cast<const std::uint8_t*>(view.data()), view.size(),
                            blocks);
  py::list out;
  for (const auto& block : blocks) {
    out.append(py::make_tuple(block.tag, block.begin, block.end, block.round, block.closed));
  }
  return out;
}

}  // namespace

PYBIND11_MODULE(_scanner, m) {
  m.doc() =
      "C++ tag-span scanner (mempo.ops.spans is the public API). Tag codes index the scanner's tag "
      "table (tag_names; by default TAG_NAMES, actions ACTION_TAGS, opaque OPAQUE_TAG).";
  py::tuple names(mempo::scanner::kNumTags);
  for (int tag = 0; tag < mempo::scanner::kNumTags; ++tag) {
    names[static_cast<std::size_t>(tag)] =
        py::str(std::string(mempo::scanner::kTagNames[static_cast<std::size_t>(tag)]));
  }
  m.attr("TAG_NAMES") = names;
  m.attr("ACTION_TAGS") = py::make_tuple(2, 3, 4);
  m.attr("OPAQUE_TAG") = mempo::scanner::kInformationTag;
  m.attr("MAX_TAGS") = mempo::scanner::kMaxTags;
  m.attr("MAX_NAME_BYTES") = mempo::scanner::kMaxNameBytes;

  py::class_<SpanScanner>(m, "Scanner")
      .def(py::init(&make_scanner), py::arg("token_bytes"), py::arg("token_offsets"),
           py::arg("token_path"), py::arg("tag_names") = py::none(),
           py::arg("action_tags") = py::none(), py::arg("opaque_tag") = py::none(),
           "Copies a CSR token table: token_bytes uint8 [B], token_offsets int64 [V+1]. "
           "token_path: scan token by token (False: concatenate and scan every byte); both paths "
           "give identical results. tag_names (str list, code = index), action_tags (codes of the "
           "tags that finish a round), opaque_tag (the tool-result code, or -1): the tag table, "
           "all three or none (the default TAG_NAMES table); ValueError for a bad table.")
      .def_property_readonly(
          "tag_names",
          [](const SpanScanner& s) {
            std::vector<std::string> names;
            for (int tag = 0; tag < s.tags().num_tags(); ++tag) names.push_back(s.tags().name(tag));
            return names;
          },
          "The tag table's names (tag code = index).")
      .def_property_readonly("vocab_size", &SpanScanner::vocab_size)
      .def_property_readonly("token_path", &SpanScanner::token_path)
      .def_property_readonly(
          "marker_token_ids",
          [](const SpanScanner& s) {
            const auto& ids = s.marker_token_ids();
            return std::vector<std::int64_t>(ids.begin(), ids.end());
          },
          "Per marker code (2*tag + closing) of the tag table, the smallest id whose bytes are "
          "exactly that marker, or -1.")
      .def("scan", &scan, py::arg("ids"), py::arg("seq_offsets"),
           py::arg("reject_out_of_vocab") = false,
           "ids int64 [T] flat, seq_offsets int64 [N+1] CSR -> (span_offsets int64 [N+1], "
           "tag int64 [S], start int64 [S], end int64 [S], round int64 [S], closed uint8 [S]). "
           "Ids outside [0, V) count as zero-byte tokens, or raise ValueError naming the first "
           "one and its (sequence, position) when reject_out_of_vocab is set.");

  m.def("flatten_int_sequences", &flatten_int_sequences, py::arg("sequences"),
        "list/tuple of lists/tuples of ints -> (flat int64 [T], offsets int64 [N+1]), or None "
        "when anything else is found (then convert with numpy).");
  m.def("scan_text", &scan_text, py::arg("text"), py::arg("tag_names") = py::none(),
        py::arg("action_tags") = py::none(), py::arg("opaque_tag") = py::none(),
        "Grammar over raw bytes: list of (tag, byte_begin, byte_end, round, closed); the tag table "
        "as Scanner takes it.");
}
