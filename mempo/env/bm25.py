"""BM25 retrieval (the embedded default, registered as "bm25"): the tokenisation (`Tokenizer`,
`s_stem`, `LUCENE_STOPWORDS`), `BM25Retriever` (bm25s, Lucene BM25, k1=1.5, b=0.75; build, save,
load) and `load_or_build_bm25`, which reuses a saved index built from the same corpus file.

A hit's score is the BM25 sum over the query's terms (> 0); documents sharing no term are never
returned. bm25s and numpy are imported inside the functions that use them.
"""
import functools
import json
import os
import stat
import re
import time
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence, Union

from mempo.env.corpus import CorpusError, Document, corpus_file_problem, corpus_fingerprint, iter_corpus
from mempo.env.local import LocalRetriever, MappedDocuments, MemoryDocuments, save_documents, topk_rows
from mempo.env.retriever import (
    DEFAULT_PAGE_CHARS, DEFAULT_TOPK, check_page_chars, check_queries, check_topk, register_retriever,
)
from mempo.utils.digest import sha256_file
from mempo.utils.jsonl import loads_bounded
from mempo.utils.types import PathLike

__all__ = ["LUCENE_STOPWORDS", "s_stem", "Tokenizer", "INDEX_MANIFEST", "BM25_FORMAT", "BM25_FORMAT_VERSION",
           "BM25Retriever", "load_or_build_bm25", "verify_index_files"]


# ----------------------------------------------------------------------------------------------
# Tokenisation
# ----------------------------------------------------------------------------------------------

_TOKEN_RE = re.compile(r"[^\W_]+(?:['\u2019][^\W_]+)*")
_POSSESSIVE_RE = re.compile(r"['\u2019]s$")

# Lucene's EnglishAnalyzer default stop set.
LUCENE_STOPWORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their then there these "
    "they this to was will with".split())


@functools.lru_cache(maxsize=1 << 18)
def s_stem(word: str) -> str:
    """Harman's S stemmer as Lucene's EnglishMinimalStemmer, keeping words of <= 3 characters whole."""
    if len(word) <= 3 or word[-1] != "s" or word[-2] in "us":
        return word
    if word[-2] == "e":
        if word[-3] == "i" and word[-4] not in "ae":
            return word[:-3] + "y"
        if word[-3] in "iaoe":
            return word
    return word[:-1]


@dataclass(frozen=True)
class Tokenizer:
    """Text -> index terms; stored with an index, so queries are tokenised like the documents.

    1. NFKC-normalise and case-fold;
    2. words = runs of Unicode letters and digits (``[^\\W_]+``), joined across inner apostrophes; a
       final 's is dropped and other apostrophes removed ("world's" -> "world", "don't" -> "dont");
    3. drop Lucene's 33 English stop words (``stopwords="none"`` keeps them);
    4. Harman's S stemmer as Lucene's EnglishMinimalStemmer implements it, plural endings only:
       -ies -> -y (not -eies, -aies), else a final -s is dropped unless the word ends in -us, -ss,
       -ies, -aes, -ees or -oes ("ponies" -> "pony", "horses" -> "horse", "goes" stays); words of 3
       characters or fewer are kept whole (``stemmer="none"`` skips this step).
    """
    stemmer: str = "s"          # "s" (Harman S stemmer) or "none"
    stopwords: str = "lucene"   # "lucene" (33 English words) or "none"

    def __post_init__(self):
        if self.stemmer not in ("s", "none"):
            raise ValueError(f"stemmer must be 's' or 'none', got {self.stemmer!r}")
        if self.stopwords not in ("lucene", "none"):
            raise ValueError(f"stopwords must be 'lucene' or 'none', got {self.stopwords!r}")

    def words(self, text: str) -> list[str]:
        """Normalised, case-folded words of `text` (before apostrophes, stop words and stemming)."""
        return _TOKEN_RE.findall(unicodedata.normalize("NFKC", text).casefold())

    def term(self, word: str) -> Optional[str]:
        """The index term of one word from `words`, or None for a stop word."""
        if "'" in word or "\u2019" in word:
            word = _POSSESSIVE_RE.sub("", word).replace("'", "").replace("\u2019", "")
        if self.stopwords == "lucene" and word in LUCENE_STOPWORDS:
            return None
        return s_stem(word) if self.stemmer == "s" else word

    def __call__(self, text: str) -> list[str]:
        """The index terms of `text`, in order."""
        terms = (self.term(w) for w in self.words(text))
        return [t for t in terms if t is not None]

    def to_json(self) -> dict:
        return {"stemmer": self.stemmer, "stopwords": self.stopwords}

    @classmethod
    def from_json(cls, obj: dict) -> "Tokenizer":
        return cls(stemmer=obj["stemmer"], stopwords=obj["stopwords"])


# ----------------------------------------------------------------------------------------------
# The index
# ----------------------------------------------------------------------------------------------

INDEX_MANIFEST = "mempo_index.json"
BM25_FORMAT = "mempo.bm25"
BM25_FORMAT_VERSION = 2  # 2: the manifest lists every file with its SHA-256; documents.lengths.npy
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_DOCUMENT_FILES = ("documents.jsonl", "documents.offsets.npy", "documents.lengths.npy", "ids.json")


def _index_files(index_dir: Path) -> dict[str, dict]:
    """{relative path: {"bytes", "sha256"}} of the files an index consists of (bm25s/ and the documents)."""
    names = sorted(f"bm25s/{entry.name}" for entry in (index_dir / "bm25s").iterdir() if entry.is_file())
    return {name: {"bytes": (index_dir / name).stat().st_size, "sha256": sha256_file(index_dir / name)}
            for name in names + list(_DOCUMENT_FILES)}


def _damaged_index(file: Path, index_dir: Path, reason: str) -> CorpusError:
    return CorpusError(f"{file}: damaged BM25 index in {index_dir} ({reason}); rebuild the index "
                       f"(serve-retriever --rebuild)")


def verify_index_files(index_dir: PathLike, manifest: dict) -> None:
    """Check every file the manifest lists against its size and SHA-256 (reads each file once more,
    at start-up). CorpusError naming the first file that is missing, not a regular file, of another
    size or content, or a manifest entry of the wrong type; the message says to rebuild."""
    index_dir = Path(index_dir)
    where = index_dir / INDEX_MANIFEST
    files = manifest.get("files")
    if not isinstance(files, dict) or not all(name in files for name in _DOCUMENT_FILES) \
            or not any(isinstance(name, str) and name.startswith("bm25s/") for name in files):
        raise CorpusError(f"{where}: damaged index manifest (no list of the index files); rebuild the index")
    for name, record in files.items():
        parts = name.split("/") if isinstance(name, str) else []
        if not parts or any(part in ("", ".", "..") for part in parts) or not isinstance(record, dict) \
                or isinstance(record.get("bytes"), bool) or not isinstance(record.get("bytes"), int) \
                or not isinstance(record.get("sha256"), str) or not _HEX64.match(record["sha256"]):
            raise CorpusError(f"{where}: damaged index manifest (entry {name!r}); rebuild the index")
        file = index_dir / name
        damaged = functools.partial(_damaged_index, file, index_dir)
        try:
            info = file.stat()
        except OSError as error:
            raise damaged(f"{'missing' if isinstance(error, FileNotFoundError) else 'unreadable'}, listed in "
                          f"{INDEX_MANIFEST}") from None
        if not stat.S_ISREG(info.st_mode):
            raise damaged(f"not a regular file, listed in {INDEX_MANIFEST}")
        if info.st_size != record["bytes"]:
            raise damaged(f"{info.st_size} bytes, {INDEX_MANIFEST} records {record['bytes']}")
        try:
            digest = sha256_file(file)
        except OSError as error:
            raise damaged(f"unreadable: {error.strerror}") from None
        if digest != record["sha256"]:
            raise damaged(f"its SHA-256 differs from the one {INDEX_MANIFEST} records")


class BM25Retriever(LocalRetriever):
    """BM25 over a local corpus (bm25s, Lucene BM25, default k1=1.5, b=0.75; title and text indexed
    together); build in memory, save, and reload.

    Scores are BM25 sums over the query's terms (a repeated query term counts again); documents
    sharing no term with the query are never returned, so a query may get fewer than topk hits.
    Safe to call from several threads at once (all state is read-only after construction).
    """

    name = "bm25"

    def __init__(self, bm25, documents: Union[MemoryDocuments, MappedDocuments], tokenizer: Tokenizer, *,
                 page_chars: int = DEFAULT_PAGE_CHARS, source: Optional[dict] = None):
        self._bm25 = bm25
        self._vocab = bm25.vocab_dict
        self._docs = documents
        self.tokenizer = tokenizer
        self.page_chars = check_page_chars(page_chars)
        self.source = source  # the corpus file it was built from: {"size", "mtime_ns", "sha256"}, or None

    @classmethod
    def build(cls, documents: Iterable[Document], *, tokenizer: Optional[Tokenizer] = None, k1: float = 1.5,
              b: float = 0.75, method: str = "lucene", page_chars: int = DEFAULT_PAGE_CHARS,
              source: Optional[dict] = None) -> "BM25Retriever":
        """Index `documents` (kept in memory); raises `CorpusError` if empty, duplicated, or term-less."""
        import bm25s  # reason: bm25s loads numpy; `import mempo.env` and `mempo --help` stay without it

        tokenizer = tokenizer or Tokenizer()
        store = MemoryDocuments(documents)
        if len(store) == 0:
            raise CorpusError("cannot index an empty corpus")
        vocab: dict[str, int] = {}     # index term -> term id
        word_ids: dict[str, int] = {}  # word (before stop words and stemming) -> term id, -1 = stop word
        token_ids = []
        for doc in store:
            words = tokenizer.words(doc.title + "\n" + doc.text)
            try:
                ids = [word_ids[w] for w in words]
            except KeyError:
                for w in words:
                    if w not in word_ids:
                        term = tokenizer.term(w)
                        word_ids[w] = -1 if term is None else vocab.setdefault(term, len(vocab))
                ids = [word_ids[w] for w in words]
            token_ids.append(list(filter((-1).__ne__, ids)))
        if not vocab:
            raise CorpusError("the corpus has no indexable terms (every document is empty or stop words)")
        bm25 = bm25s.BM25(k1=k1, b=b, method=method)
        bm25.index((token_ids, vocab), create_empty_token=False, show_progress=False)
        return cls(bm25, store, tokenizer, page_chars=page_chars, source=source)

    def save(self, index_dir: PathLike) -> Path:
        """Write the index and its documents to `index_dir` (created; an older index there is replaced).

        Layout: ``bm25s/`` (the bm25s arrays and vocabulary), ``documents.jsonl`` +
        ``documents.offsets.npy`` (the documents in index order and their byte offsets, read through
        a memory map on load), ``documents.lengths.npy`` (title and text characters per document,
        so a server bounds an answer before reading it), ``ids.json``, and ``mempo_index.json``
        (format, tokenizer, BM25 parameters, document count, the corpus file's size, mtime and
        SHA-256 when built from a file, and "files": the size and SHA-256 of every other file, which
        `load` checks), written last: a directory without it is not an index.
        """
        index_dir = Path(index_dir)
        index_dir.mkdir(parents=True, exist_ok=True)
        manifest_path = index_dir / INDEX_MANIFEST
        if manifest_path.exists():
            manifest_path.unlink()  # the directory is not a valid index until the new manifest lands
        self._bm25.save(str(index_dir / "bm25s"), show_progress=False)
        num_docs = save_documents(self._docs, index_dir)
        import bm25s  # reason: bm25s loads numpy; `import mempo.env` and `mempo --help` stay without it

        manifest = {
            "format": BM25_FORMAT, "format_version": BM25_FORMAT_VERSION, "num_docs": num_docs,
            "tokenizer": self.tokenizer.to_json(),
            "bm25": {"k1": self._bm25.k1, "b": self._bm25.b, "method": self._bm25.method},
            "corpus": self.source, "bm25s_version": getattr(bm25s, "__version__", "unknown"),
            "files": _index_files(index_dir),
        }
        tmp = manifest_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, manifest_path)
        return index_dir

    @staticmethod
    def read_manifest(index_dir: PathLike, *, any_version: bool = False) -> Optional[dict]:
        """The manifest of a saved BM25 index in `index_dir`, or None if the directory holds none.
        CorpusError for another format version (an index of format 1, without digests, must be
        rebuilt) unless `any_version`."""
        path = Path(index_dir) / INDEX_MANIFEST
        if not path.is_file():
            return None
        try:
            manifest = loads_bounded(path.read_bytes(), str(path))  # nesting bounded: no RecursionError
        except (OSError, UnicodeDecodeError, ValueError) as error:
            raise CorpusError(f"{path}: damaged index manifest ({type(error).__name__}); rebuild the index") from None
        if not isinstance(manifest, dict):
            raise CorpusError(f"{path}: damaged index manifest (not a JSON object); rebuild the index")
        if manifest.get("format") != BM25_FORMAT:
            raise CorpusError(f"{path}: not a mempo BM25 index (format {manifest.get('format')!r})")
        if manifest.get("format_version") != BM25_FORMAT_VERSION and not any_version:
            raise CorpusError(f"{path}: index format version {manifest.get('format_version')} is not "
                              f"{BM25_FORMAT_VERSION} (format 1 carries no digests of its files); rebuild the "
                              f"index (serve-retriever --rebuild)")
        return manifest

    @classmethod
    def load(cls, index_dir: PathLike, *, mmap_arrays: bool = True,
             page_chars: int = DEFAULT_PAGE_CHARS) -> "BM25Retriever":
        """Reload an index written by `save`; documents are always read through a memory map.

        `mmap_arrays` memory-maps the BM25 arrays too (low resident memory, shared page cache).
        Every file is checked against the manifest's digests first (`verify_index_files`), so an
        emptied vocabulary or a zeroed array of the same size is refused, naming the file.
        """
        import bm25s  # reason: bm25s loads numpy; `import mempo.env` and `mempo --help` stay without it

        index_dir = Path(index_dir)
        manifest = cls.read_manifest(index_dir)
        if manifest is None:
            raise CorpusError(f"{index_dir}: no saved index ({INDEX_MANIFEST} missing)")
        verify_index_files(index_dir, manifest)
        store = None
        try:
            bm25 = bm25s.BM25.load(str(index_dir / "bm25s"), mmap=mmap_arrays, show_progress=False)
            store = MappedDocuments(index_dir / "documents.jsonl", index_dir / "documents.offsets.npy",
                                     index_dir / "ids.json", index_dir / "documents.lengths.npy")
            if len(store) != manifest["num_docs"] or bm25.scores["num_docs"] != manifest["num_docs"]:
                raise CorpusError(f"{index_dir}: document count does not match the manifest (index corrupted)")
            tokenizer = Tokenizer.from_json(manifest["tokenizer"])
        except Exception as error:  # bm25s / numpy / json errors name no index; say which and how to fix it
            if store is not None:
                store.close()
            if isinstance(error, CorpusError):
                raise
            where = getattr(error, "filename", None) or index_dir
            detail = " ".join(str(error).split())[:200]
            raise CorpusError(f"{where}: damaged BM25 index in {index_dir} ({type(error).__name__}: {detail}); "
                              f"rebuild it (serve-retriever --rebuild)") from None
        return cls(bm25, store, tokenizer, page_chars=page_chars, source=manifest.get("corpus"))

    def rank(self, queries: Sequence[str], topk: int = DEFAULT_TOPK) -> list[list[tuple[int, float]]]:
        queries = check_queries(queries)
        topk = check_topk(topk)
        results = []
        for query in queries:
            term_ids = [self._vocab[t] for t in self.tokenizer(query) if t in self._vocab]
            if not term_ids:
                results.append([])
                continue
            scores = self._bm25.get_scores_from_ids(term_ids)
            results.append([(int(row), float(scores[row])) for row in topk_rows(scores, topk)])
        return results


def _corpus_file_info(path: PathLike) -> dict:
    stat = os.stat(path)
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": corpus_fingerprint(path)}


def _same_corpus_file(path: PathLike, recorded: Optional[dict]) -> bool:
    """Whether `path` is the file an index was built from: same size and mtime, else same SHA-256."""
    if not recorded:
        return False
    stat = os.stat(path)
    if stat.st_size != recorded.get("size"):
        return False
    return stat.st_mtime_ns == recorded.get("mtime_ns") or corpus_fingerprint(path) == recorded.get("sha256")


@register_retriever("bm25")
def load_or_build_bm25(corpus: Optional[PathLike] = None, index_dir: Optional[PathLike] = None, *,
                       documents: Optional[Iterable[Document]] = None, rebuild: bool = False,
                       tokenizer: Optional[Tokenizer] = None, page_chars: int = DEFAULT_PAGE_CHARS,
                       mmap_arrays: bool = True, log: Optional[Callable[[str], None]] = None) -> BM25Retriever:
    """Open a BM25 retriever: load `index_dir` if it holds an index for this corpus, else build.

    - `index_dir` with a saved index and no `corpus`: load it.
    - `index_dir` with a saved index and a `corpus` file: load it if it was built from that file
      (same size and modification time, or else same SHA-256), else rebuild from the file and
      overwrite the index (reported through `log`).
    - `index_dir` with an index of an older format (1: no digests): rebuilt from `corpus` when
      given (reported through `log`), else refused (CorpusError: rebuild the index).
    - no saved index (or `rebuild`): build from `corpus` (a jsonl path) or `documents`, then save to
      `index_dir` when given (and reload it memory-mapped, so serving uses little memory).
    `log` receives one-line progress messages (e.g. ``print`` to stderr); None stays silent.
    """
    say = log or (lambda message: None)
    if corpus is not None and documents is not None:
        raise ValueError("give either corpus (a path) or documents, not both")
    problem = corpus_file_problem(corpus) if corpus is not None else None
    if problem is not None:
        raise CorpusError(f"{corpus}: {problem}")
    if index_dir is not None and not rebuild:
        manifest = BM25Retriever.read_manifest(index_dir, any_version=corpus is not None)
        if manifest is not None and manifest.get("format_version") != BM25_FORMAT_VERSION:
            say(f"index {index_dir} has format version {manifest.get('format_version')} (now "
                f"{BM25_FORMAT_VERSION}); rebuilding it from {corpus}")
        elif manifest is not None:
            if corpus is None or _same_corpus_file(corpus, manifest.get("corpus")):
                started = time.perf_counter()
                retriever = BM25Retriever.load(index_dir, mmap_arrays=mmap_arrays, page_chars=page_chars)
                say(f"loaded BM25 index {index_dir} ({retriever.num_docs} documents) in "
                    f"{time.perf_counter() - started:.1f} s")
                return retriever
            say(f"index {index_dir} was built from another corpus file; rebuilding it from {corpus}")
    if corpus is None and documents is None:
        where = f" in {index_dir}" if index_dir is not None else ""
        raise CorpusError(f"no saved index{where} and no corpus to build one from")
    started = time.perf_counter()
    source = _corpus_file_info(corpus) if corpus is not None else None
    docs = iter_corpus(corpus) if corpus is not None else documents
    retriever = BM25Retriever.build(docs, tokenizer=tokenizer, page_chars=page_chars, source=source)
    say(f"built BM25 index over {retriever.num_docs} documents in {time.perf_counter() - started:.1f} s")
    if index_dir is not None:
        retriever.save(index_dir)
        retriever.close()
        retriever = BM25Retriever.load(index_dir, mmap_arrays=mmap_arrays, page_chars=page_chars)
        say(f"saved BM25 index to {index_dir}")
    return retriever
