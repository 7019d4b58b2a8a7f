"""Question data: Search-R1-style QA records, multi-objective episodes (MEM1 composition), jsonl/parquet I/O.

A QA record (`QARecord`) is one question with its gold answer aliases (Search-R1's
``{"id", "question", "golden_answers": [...], ...}``); an episode (`Episode`) is the k >= 1
questions one agent trajectory answers, with one alias list per question. jsonl files hold one
JSON object per non-blank line (UTF-8); a bad line raises `DataError` naming the file and its
1-based line (parquet: the 0-based row).
"""
from __future__ import annotations

import itertools
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional, Sequence, Union

from mempo.errors import MempoError
from mempo.utils.jsonl import iter_jsonl_records, write_jsonl
from mempo.utils.types import PathLike

__all__ = [
    "DataError",
    "MissingDependencyError",
    "QARecord",
    "Episode",
    "PROMPT_STYLES",
    "user_turn",
    "EPISODE_INSTRUCTIONS",
    "TOOLS_INSTRUCTIONS",
    "COMPACT_INSTRUCTIONS",
    "GOLD_KEYS",
    "MAX_QUESTION_CHARS",
    "check_question",
    "qa_record_from_json",
    "iter_qa_jsonl",
    "load_qa_jsonl",
    "load_qa_parquet",
    "load_qa",
    "dataset_name",
    "QADataset",
    "load_qa_datasets",
    "check_qa_files",
    "write_qa_jsonl",
    "make_episode_prompt",
    "parse_episode_prompt",
    "compose_episodes",
    "write_episodes_jsonl",
    "load_episodes_jsonl",
]

PROMPT_STYLES = ("numbered", "joined", "compact", "bare", "tools")
GOLD_KEYS = ("golden_answers", "answers", "answer", "reward_model.ground_truth.target")

EPISODE_INSTRUCTIONS = (
    "Answer the questions below using the search tool over a document corpus. Every turn, first "
    "write <mem>...</mem>: everything you still need to remember, because older turns are not "
    "shown again. Then write <think>...</think>, then exactly one action: <search>query</search>, "
    "<access>doc-id page</access> (read one page of a long document) or <answer>...</answer>. "
    "Search and access results come back inside <information>...</information>."
)
#: The instruction paragraph of the "tools" style: the turn protocol without naming a tool or a call
#: syntax, for a user's tools and the json format (their names, schemas and call form are the system
#: prompt's or the user's own prompt's).
TOOLS_INSTRUCTIONS = (
    "Answer the questions below using the tools. Every turn, first write <mem>...</mem>: everything you "
    "still need to remember, because older turns are not shown again. Then write <think>...</think>, then "
    "exactly one action: one tool call, or <answer>...</answer>."
)

#: The instruction paragraph of the "compact" style: the same protocol in fewer words, without
#: the access tool (for worlds without long documents and small models on CPU).
COMPACT_INSTRUCTIONS = (
    "Answer with the search tool. Each turn write <mem>...</mem> (what to remember: older turns "
    "are hidden), <think>...</think>, then <search>query</search> or <answer>...</answer>."
)

_NUMBERED_RE = re.compile(r"^(\d+)\. (.+)$")
#: Every character `str.splitlines` breaks a line at (a question must stay one line of the prompt).
_LINE_BREAK_RE = re.compile("[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")

#: The longest question a QA record may hold (characters); a longer one is refused at load (a
#: question is copied into every round's prompt; real benchmark questions are under 1,000).
MAX_QUESTION_CHARS = 4096


class DataError(MempoError, ValueError):
    """A QA or episode record (or file) that does not follow its format (`qa_record_from_json`,
    `Episode.from_json`); the message names the file and line."""


class MissingDependencyError(MempoError, ImportError):
    """An optional package needed for a file format is not installed (the message names it)."""


@dataclass(frozen=True)
class QARecord:
    """One question, its gold answer aliases (``golden_answers``; None: a record without a reference
    answer, loaded with ``gold_field=None``), an id, and the other input fields."""

    id: str
    question: str
    golden_answers: Optional[list[str]]
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """Search-R1-style object: ``{"id", "question", "golden_answers", **metadata}`` (no
        ``golden_answers`` when it has none)."""
        golds = {} if self.golden_answers is None else {"golden_answers": list(self.golden_answers)}
        return {**self.metadata, "id": self.id, "question": self.question, **golds}


@dataclass(frozen=True)
class Episode:
    """k sub-questions (the *objectives*) answered in one trajectory.

    ``prompt`` is the user message (`make_episode_prompt`). ``golds[i]`` lists the aliases of
    objective i, in question order (pass it straight to `mempo.protocol.reward.compute_score`), or
    ``golds`` is None: an episode without reference answers (scored by a user's outcome reward only);
    ``source_ids[i]`` is the id of the QA record objective i came from (empty when unknown);
    ``metadata`` holds anything else (e.g. the synthetic world's hop chains).
    """

    id: str
    questions: list[str]
    golds: Optional[list[list[str]]]
    prompt: str
    source_ids: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.questions:
            raise DataError(f"episode {self.id!r} has no questions")
        if self.golds is not None and len(self.golds) != len(self.questions):
            raise DataError(f"episode {self.id!r}: {len(self.questions)} questions but "
                            f"{len(self.golds)} gold lists")

    @property
    def num_objectives(self) -> int:
        """k, the number of sub-questions."""
        return len(self.questions)

    def to_json(self) -> dict[str, Any]:
        """``{"id", "questions", "golds", "prompt", "source_ids", "metadata"}``."""
        golds = None if self.golds is None else [list(aliases) for aliases in self.golds]
        return {"id": self.id, "questions": list(self.questions), "golds": golds, "prompt": self.prompt,
                "source_ids": list(self.source_ids), "metadata": dict(self.metadata)}

    @classmethod
    def from_json(cls, obj: Any) -> "Episode":
        """Inverse of `to_json`; raises `DataError` for a malformed object."""
        if not isinstance(obj, dict):
            raise DataError(f"expected a JSON object, got {type(obj).__name__}")
        for key in ("id", "questions", "golds", "prompt"):
            if key not in obj:
                raise DataError(f"missing field {key!r}")
        questions, golds = obj["questions"], obj["golds"]
        if not isinstance(questions, list) or not all(isinstance(q, str) for q in questions):
            raise DataError("field 'questions' must be a list of strings")
        if golds is not None and (not isinstance(golds, list) or not all(
                isinstance(aliases, list) and all(isinstance(a, str) for a in aliases) for aliases in golds)):
            raise DataError("field 'golds' must be a list of lists of strings, or null")
        if not isinstance(obj["prompt"], str):
            raise DataError("field 'prompt' must be a string")
        return cls(id=str(obj["id"]), questions=questions, golds=golds, prompt=obj["prompt"],
                   source_ids=[str(s) for s in obj.get("source_ids", [])],
                   metadata=dict(obj.get("metadata", {})))


# ---------------------------------------------------------------------------------------------
# QA records
# ---------------------------------------------------------------------------------------------


def _lookup(obj: dict, dotted: str) -> tuple[bool, Any]:
    node: Any = obj
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _aliases(value: Any, key: str) -> list[str]:
    if isinstance(value, bool):
        raise DataError(f"field {key!r} must be a string or a list of strings, got bool")
    if isinstance(value, (str, int)):
        items = [value]
    elif isinstance(value, (list, tuple)) or (hasattr(value, "tolist") and not isinstance(value, dict)):
        items = list(value.tolist() if hasattr(value, "tolist") else value)
    else:
        raise DataError(f"field {key!r} must be a string or a list of strings, got {type(value).__name__}")
    if not items:
        raise DataError(f"field {key!r} is an empty list: give at least one gold answer")
    aliases = []
    for i, item in enumerate(items):
        if isinstance(item, bool) or not isinstance(item, (str, int)):
            raise DataError(f"field {key!r}[{i}] must be a string, got {type(item).__name__}")
        item = str(item)
        if not item.strip():
            raise DataError(f"field {key!r}[{i}] is blank")
        _check_encodable(item, f"{key}[{i}]")
        aliases.append(item)
    return aliases


def _check_encodable(text: str, name: str) -> None:
    """DataError when `text` cannot be written as UTF-8 (a lone surrogate, e.g. JSON's ``"\\ud800"``)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise DataError(f"field {name!r} is not encodable text ({exc.reason} at character {exc.start + 1})") \
            from None


def check_question(question: Any, name: str = "question", *, one_line: bool = True) -> str:
    """`question` when the agent can take it: a non-blank string of at most `MAX_QUESTION_CHARS`
    characters, encodable as UTF-8 (no lone surrogate, e.g. JSON's ``"\\ud800"`` or a command-line
    byte that is not UTF-8) and, when `one_line`, without a line break of any kind (a QA record: the
    episode prompt lists one question a line; a served or asked question is the prompt as it is).
    DataError naming the field `name` otherwise. QA records, `mempo serve` and `mempo ask` check
    their questions here."""
    if not isinstance(question, str):
        raise DataError(f"field {name!r} must be a string, got {type(question).__name__}")
    if not question.strip():
        raise DataError(f"field {name!r} is blank")
    if len(question) > MAX_QUESTION_CHARS:
        raise DataError(f"field {name!r} is {len(question)} characters long; the limit is {MAX_QUESTION_CHARS}")
    line_break = _LINE_BREAK_RE.search(question) if one_line else None
    if line_break is not None:
        raise DataError(f"field {name!r} holds a line break ({line_break.group()!r} at character "
                        f"{line_break.start() + 1}); a question must be one line")
    _check_encodable(question, name)
    return question


def qa_record_from_json(obj: Any, default_id: Optional[str] = None, gold_field: Optional[str] = "auto") -> QARecord:
    """Build a `QARecord` from one decoded record; raises `DataError`.

    Fields: ``question`` (required): a non-blank string of one line (no line break of any kind:
    the prompt lists one question a line), at most `MAX_QUESTION_CHARS` characters, encodable as
    UTF-8 (no lone surrogate). ``data_source`` (optional): a string or null (it names the dataset).
    The gold aliases, from the first of
    `GOLD_KEYS` present (``golden_answers``, ``answers``, ``answer``,
    ``reward_model.ground_truth.target``, Search-R1's processed parquet): one string or a list of
    strings (a tuple or a parquet array counts as a list; integers become ``str``, a bare year); not
    empty, no blank alias. ``gold_field`` (``data.gold_field``): ``"auto"`` as just said, a (dotted)
    field name: the aliases from that field only, None: the record has no reference answer (golds
    None). ``id`` (optional, string or integer): default ``default_id`` (the loaders pass
    ``"<stem>:<line>"``, 1-based, or ``"<stem>:<row>"``, 0-based). Every other field is kept
    untouched in ``QARecord.metadata`` (``data_source``, ``split`` ...).
    """
    if not isinstance(obj, dict):
        raise DataError(f"expected a JSON object, got {type(obj).__name__}")
    if "question" not in obj:
        raise DataError("missing field 'question'")
    question = check_question(obj["question"])
    source = obj.get("data_source")
    if source is not None and not isinstance(source, str):
        raise DataError(f"field 'data_source' must be a string, got {type(source).__name__}")
    if isinstance(source, str):
        _check_encodable(source, "data_source")
    golds: Optional[list[str]] = None
    used_key = None
    for key in (GOLD_KEYS if gold_field == "auto" else () if gold_field is None else (gold_field,)):
        present, value = _lookup(obj, key)
        if present:
            golds, used_key = _aliases(value, key), key
            break
    if golds is None and gold_field == "auto":
        raise DataError("missing gold answers: expected one of the fields " + ", ".join(GOLD_KEYS))
    if golds is None and gold_field is not None:
        raise DataError(f"missing gold answers: no field {gold_field!r} (data.gold_field)")
    if "id" in obj and obj["id"] is not None:
        record_id = obj["id"]
        if isinstance(record_id, bool) or not isinstance(record_id, (str, int)):
            raise DataError(f"field 'id' must be a string or an integer, got {type(record_id).__name__}")
        record_id = str(record_id)
        _check_encodable(record_id, "id")
    elif default_id is not None:
        record_id = default_id
    else:
        raise DataError("missing field 'id' (and no default id given)")
    top_key = used_key.split(".")[0] if used_key is not None else None
    metadata = {k: v for k, v in obj.items() if k not in ("id", "question", top_key)}
    return QARecord(record_id, question, golds, metadata)


def _record_key(record: QARecord) -> tuple[Any, str]:
    """What must be unique within one QA file: (``data_source``, id). Search-R1's merged
    ``test.parquet`` repeats FlashRAG ids (``test_0`` ...) across its data sources."""
    return record.metadata.get("data_source"), record.id


def _duplicate(record: QARecord, where: str) -> str:
    source = record.metadata.get("data_source")
    within = f" in data_source {source!r}" if source is not None else ""
    return f"duplicate id {record.id!r}{within} (first seen {where})"


def iter_qa_jsonl(path: PathLike, gold_field: Optional[str] = "auto") -> Iterator[QARecord]:
    """Stream the QA records of a jsonl file, checking every line; errors name file and line
    (`gold_field`: as `qa_record_from_json`)."""
    stem = Path(path).stem
    first_line_of: dict[tuple[Any, str], int] = {}

    def parse(obj: Any, lineno: int) -> QARecord:
        record = qa_record_from_json(obj, default_id=f"{stem}:{lineno}", gold_field=gold_field)
        first = first_line_of.setdefault(_record_key(record), lineno)
        if first != lineno:
            raise DataError(_duplicate(record, f"on line {first}"))
        return record

    return iter_jsonl_records(path, parse, DataError)


def load_qa_jsonl(path: PathLike, gold_field: Optional[str] = "auto") -> list[QARecord]:
    """All QA records of a jsonl file (see `iter_qa_jsonl`)."""
    return list(iter_qa_jsonl(path, gold_field))


def load_qa_parquet(path: PathLike, gold_field: Optional[str] = "auto") -> list[QARecord]:
    """All QA records of a parquet file (Search-R1's ``train.parquet`` / ``test.parquet``).

    Needs pyarrow (raises `MissingDependencyError` without it). Errors name the file and the
    0-based row.
    """
    path = Path(path)
    try:
        import pyarrow.parquet as pq  # reason: optional dependency (parquet files only)
    except ImportError:
        raise MissingDependencyError(
            f"{path}: reading parquet needs the 'pyarrow' package, which is not installed "
            "(pip install pyarrow), or convert the file to jsonl") from None
    if not path.exists():
        raise DataError(f"{path}: file not found")
    try:
        rows = pq.read_table(path).to_pylist()
    except Exception as exc:  # pyarrow raises its own error types for corrupt files
        raise DataError(f"{path}: not a readable parquet file ({type(exc).__name__}: {exc})") from None
    records, seen = [], {}
    for row_index, row in enumerate(rows):
        try:
            record = qa_record_from_json(row, default_id=f"{path.stem}:{row_index}", gold_field=gold_field)
        except DataError as exc:
            raise DataError(f"{path}: row {row_index}: {exc}") from None
        first = seen.setdefault(_record_key(record), row_index)
        if first != row_index:
            raise DataError(f"{path}: row {row_index}: {_duplicate(record, f'in row {first}')}")
        records.append(record)
    return records


def load_qa(path: PathLike, gold_field: Optional[str] = "auto") -> list[QARecord]:
    """QA records from ``.jsonl`` / ``.json`` (one object per line) or ``.parquet`` by file suffix
    (`gold_field`: where the reference answers are, as `qa_record_from_json` reads it)."""
    if Path(path).is_dir():
        raise DataError(f"{path}: is a directory, not a QA file")
    suffix = Path(path).suffix.lower()
    if suffix == ".parquet":
        return load_qa_parquet(path, gold_field)
    if suffix in (".jsonl", ".json", ".ndjson"):
        return load_qa_jsonl(path, gold_field)
    raise DataError(f"{path}: unknown QA file type {suffix!r} (expected .jsonl or .parquet)")


def dataset_name(record: QARecord, default: str) -> str:
    """The dataset a record belongs to: its ``data_source`` (a non-blank string) or ``default``."""
    source = record.metadata.get("data_source")
    return source.strip() if isinstance(source, str) and source.strip() else default


@dataclass
class QADataset:
    """The records of one dataset (`load_qa_datasets`) and the files they came from."""

    name: str
    records: list[QARecord]
    files: list[str]


def check_qa_files(paths: Sequence[PathLike]) -> list[Path]:
    """`paths` as Paths, each an existing file given once; `DataError` naming the path for an empty
    list, a missing path, a directory, or a file given twice (by any path: it would double its
    questions silently)."""
    if not paths:
        raise DataError("no QA files given")
    given: dict[Path, Path] = {}
    for path in map(Path, paths):
        if path.is_dir():
            raise DataError(f"{path}: is a directory, not a QA file")
        if not path.is_file():
            raise DataError(f"{path}: QA file not found")
        first = given.setdefault(path.resolve(), path)
        if first is not path:
            raise DataError(f"{path}: the same QA file is given twice (also as {first}); give each file once")
    return list(given.values())


def load_qa_datasets(paths: Sequence[PathLike], gold_field: Optional[str] = "auto") -> dict[str, QADataset]:
    """The records of QA files grouped by dataset (`dataset_name`, default: the file's stem).
    Evaluation composes and reports each dataset apart.

    Datasets are in first-seen order, records in file order; one file may hold several datasets
    (Search-R1's merged ``test.parquet``) and several files one. Raises `DataError` when no file is
    given, for a missing file, a directory or a malformed file (naming it), for a file without
    records and for a file given twice (the same file, by any path: it would double its questions
    silently). `gold_field`: as `load_qa`.
    """
    groups: dict[str, QADataset] = {}
    for path in check_qa_files(paths):
        records = load_qa(path, gold_field)
        if not records:
            raise DataError(f"{path}: no QA records (the file is empty)")
        for record in records:
            name = dataset_name(record, path.stem)
            group = groups.setdefault(name, QADataset(name, [], []))
            group.records.append(record)
            if str(path) not in group.files:
                group.files.append(str(path))
    return groups


def write_qa_jsonl(path: PathLike, records: Iterable[QARecord]) -> int:
    """Write QA records as Search-R1-style jsonl (`QARecord.to_json`); returns the count."""
    return write_jsonl(path, (record.to_json() for record in records))


# ---------------------------------------------------------------------------------------------
# Episodes
# ---------------------------------------------------------------------------------------------


def make_episode_prompt(questions: Sequence[str], style: str = "numbered") -> str:
    """The user message of an episode asking ``questions``.

    Style ``"numbered"`` (default)::

        <EPISODE_INSTRUCTIONS>

        Questions:
        1. <question 1>
        2. <question 2>

        Give all 2 answers in one <answer> block, in the order of the questions, separated by ";",
        e.g. <answer>answer 1; answer 2</answer>.

    (the last sentence is one line). With one question the last line is ``Give the answer in one
    <answer> block, e.g. <answer>your answer</answer>.`` Style ``"joined"`` (MEM1's layout) puts the
    questions on one line joined with ``"; "``: ``Questions: <q1>; <q2>`` (questions that contain
    ``";"`` cannot use it). Style ``"compact"`` (short prompts for small models) has the numbered
    layout with `COMPACT_INSTRUCTIONS` (no access tool) and the closing line ``Give all 2 answers in
    one <answer>, separated by ";".`` (one question: ``Give the answer in one <answer>.``). Style
    ``"bare"`` is ``"compact"`` without the instruction paragraph (the question list and the closing
    line only): for a model trained from scratch on the protocol, which an instruction paragraph does
    not teach, and which otherwise repeats it in every memory-context round. Style ``"tools"`` is
    ``"numbered"`` with `TOOLS_INSTRUCTIONS`, which names no tool (a user's tools, the json format).

    `parse_episode_prompt` recovers the questions from any layout; the agent's answer is split on
    ``";"`` by `mempo.protocol.reward.split_answer`.
    """
    if style not in PROMPT_STYLES:
        raise ValueError(f"style must be one of {PROMPT_STYLES}, got {style!r}")
    if not questions:
        raise ValueError("an episode needs at least one question")
    for question in questions:
        if "\n" in question or not question.strip():
            raise ValueError(f"questions must be one non-blank line each, got {question!r}")
    k = len(questions)
    if style in ("compact", "bare"):
        listing = "Questions:\n" + "\n".join(f"{i}. {q.strip()}" for i, q in enumerate(questions, 1))
        closing = ("Give the answer in one <answer>." if k == 1 else
                   f"Give all {k} answers in one <answer>, separated by \";\".")
        body = f"{listing}\n\n{closing}"
        return body if style == "bare" else f"{COMPACT_INSTRUCTIONS}\n\n{body}"
    if style in ("numbered", "tools"):
        listing = "Questions:\n" + "\n".join(f"{i}. {q.strip()}" for i, q in enumerate(questions, 1))
    else:
        if k > 1 and any(";" in q for q in questions):
            raise ValueError("the 'joined' style cannot hold questions that contain ';'")
        listing = "Questions: " + "; ".join(q.strip() for q in questions)
    if k == 1:
        closing = "Give the answer in one <answer> block, e.g. <answer>your answer</answer>."
    else:
        example = "; ".join(f"answer {i}" for i in range(1, min(k, 3) + 1)) + ("; ..." if k > 3 else "")
        closing = (f"Give all {k} answers in one <answer> block, in the order of the questions, "
                   f"separated by \";\", e.g. <answer>{example}</answer>.")
    instructions = TOOLS_INSTRUCTIONS if style == "tools" else EPISODE_INSTRUCTIONS
    return f"{instructions}\n\n{listing}\n\n{closing}"


def parse_episode_prompt(prompt: str) -> list[str]:
    """The sub-questions of a prompt made by `make_episode_prompt` (either style), in order.

    Raises `DataError` when the prompt has no question list.
    """
    lines = prompt.splitlines()
    for index, line in enumerate(lines):
        if line == "Questions:":
            questions = []
            for following in lines[index + 1:]:
                match = _NUMBERED_RE.match(following)
                if match is None or int(match.group(1)) != len(questions) + 1:
                    break
                questions.append(match.group(2))
            if questions:
                return questions
        elif line.startswith("Questions: "):
            questions = [q.strip() for q in line[len("Questions: "):].split(";")]
            if all(questions):
                return questions
    raise DataError("the prompt has no question list ('Questions:' followed by numbered lines, "
                    "or 'Questions: q1; q2')")


def user_turn(message: str, style: str = "numbered") -> str:
    """The user message of an episode from what a person typed (`mempo ask`, `mempo serve`), laid
    out as training laid out its prompts (`make_episode_prompt` in `style`), so a plain question
    reaches the model in the layout it learnt:

    1. a message that already holds a question list (`parse_episode_prompt` finds one) is kept as
       it is (its sender chose the layout);
    2. a message whose non-blank lines are all numbered ``1. …``, ``2. …`` in order asks those
       questions;
    3. any other message is one question, its white space (line breaks included) collapsed to
       single spaces.

    ValueError when the message is blank or `style` cannot hold the questions (``"joined"`` with a
    ``";"`` in one of several)."""
    try:
        parse_episode_prompt(message)
        return message
    except DataError:
        pass
    lines = [line.strip() for line in _LINE_BREAK_RE.split(message) if line.strip()]
    numbered = [_NUMBERED_RE.match(line) for line in lines]
    if numbered and all(m is not None and int(m.group(1)) == i for i, m in enumerate(numbered, 1)):
        questions = [" ".join(m.group(2).split()) for m in numbered]
    else:
        questions = [" ".join(message.split())]
    if not all(questions):
        raise ValueError("the question is empty")
    return make_episode_prompt(questions, style)


def compose_episodes(pool: Sequence[QARecord], num_objectives: Union[int, Sequence[int]], num_episodes: int,
                     seed: int = 0, *, reuse_questions: bool = True, style: str = "numbered",
                     id_prefix: str = "episode") -> list[Episode]:
    """MEM1-style multi-objective episodes: ``num_objectives`` records of ``pool`` per episode.

    Draws with ``random.Random(seed)``: deterministic in (pool order, num_objectives, num_episodes,
    seed, reuse_questions). ``num_objectives``: k of every episode, or a sequence for mixed k (episode
    i has ``num_objectives[i % len(num_objectives)]``: ``[2, 4]`` alternates). ``reuse_questions=True``
    (MEM1's behaviour): each episode draws k distinct records independently; False: the pool is
    shuffled once and cut into disjoint episodes (needs ``len(pool) >= sum of the episodes' k``).
    Episode ids are ``f"{id_prefix}-k{k}-s{seed}-{i}"`` (k: the episode's own); an episode's
    ``metadata["records"]`` keeps each record's metadata (e.g. hop chains). An episode drawing a record
    without reference answers has golds None.
    """
    cycle = [num_objectives] if isinstance(num_objectives, int) else list(num_objectives)
    if not cycle or any(not isinstance(k, int) or k < 1 for k in cycle):
        raise ValueError(f"num_objectives must be >= 1 (an int or a non-empty sequence of them), "
                         f"got {num_objectives!r}")
    if num_episodes < 0:
        raise ValueError(f"num_episodes must be >= 0, got {num_episodes}")
    counts = [cycle[i % len(cycle)] for i in range(num_episodes)]
    if len(pool) < max(counts, default=0):  # the largest k drawn: fewer episodes than the cycle draw not all of it
        raise ValueError(f"the pool has {len(pool)} questions, fewer than num_objectives={max(counts)}")
    rng = random.Random(seed)
    if reuse_questions:
        draws = [rng.sample(range(len(pool)), k) for k in counts]
    else:
        needed = sum(counts)
        if len(pool) < needed:
            raise ValueError(f"reuse_questions=False needs {needed} questions, the pool has {len(pool)}")
        order = rng.sample(range(len(pool)), needed)
        starts = [0, *itertools.accumulate(counts)][:num_episodes]
        draws = [order[start:start + k] for start, k in zip(starts, counts)]
    episodes = []
    for number, indices in enumerate(draws):
        records = [pool[i] for i in indices]
        questions = [r.question for r in records]
        episodes.append(Episode(
            id=f"{id_prefix}-k{len(indices)}-s{seed}-{number}",
            questions=questions,
            golds=None if any(r.golden_answers is None for r in records)
            else [list(r.golden_answers) for r in records],
            prompt=make_episode_prompt(questions, style),
            source_ids=[r.id for r in records],
            metadata={"records": [dict(r.metadata) for r in records]},
        ))
    return episodes


def write_episodes_jsonl(path: PathLike, episodes: Iterable[Episode]) -> int:
    """Write episodes as jsonl (`Episode.to_json`, atomic replace); returns the count."""
    return write_jsonl(path, (episode.to_json() for episode in episodes))


def load_episodes_jsonl(path: PathLike) -> list[Episode]:
    """Read episodes written by `write_episodes_jsonl`; errors name the file and line."""
    return list(iter_jsonl_records(path, lambda obj, _: Episode.from_json(obj), DataError))
