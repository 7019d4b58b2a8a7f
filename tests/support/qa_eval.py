"""QA files for the evaluation tests: records, a corpus, a rule-based reader agent, configs.

The agent is a rule-based *reader* (`ReaderAgent`, behind
`mempo.synthetic.backend.OracleBackend`'s prompt decoding): it searches each question in turn
and answers with the title of the first search hit. It sees only its prompt (system, question, its
memory, tool results), so it answers a question right exactly when the corpus holds a document
titled with the gold answer that the question's words find: "answerable" questions below. The
unanswerable ones have golds that appear nowhere in the corpus or the questions, which also lets
the tests check that no gold reaches generation.
"""
import json
import re
from pathlib import Path

from mempo.config import config_from_dict
from mempo.env.corpus import Document, write_corpus
from mempo.env.data import parse_episode_prompt
from mempo.protocol.grammar import parse_round
from mempo.synthetic.backend import OracleBackend

FIRST_NAMES = ["Amberly", "Brannic", "Corvina", "Dastrel", "Elowen", "Fennick", "Galvia", "Horatz"]
LAST_NAMES = ["Quist", "Marrow", "Velde", "Ostrand", "Pellin", "Tarrow", "Ibsk", "Wendle"]
FILLER = ("The archive keeps many old ledgers about harbours, bridges and orchards of the valley. " * 12).strip()


def keeper(i: int) -> str:
    return f"{FIRST_NAMES[i % 8]} {LAST_NAMES[(i * 3 + 1) % 8]}"


def answerable(i: int, source=None) -> dict:
    record = {"id": f"a{i}", "question": f"Who is the keeper of zorvath{i}?", "golden_answers": [keeper(i)]}
    return {**record, "data_source": source} if source else record


def unanswerable(i: int, source=None) -> dict:
    record = {"id": f"u{i}", "question": f"Who is the keeper of blorptang{i}?",
              "golden_answers": [f"Qzxvw Unfindable{i}", f"Unfindable Alias{i}"]}
    return {**record, "data_source": source} if source else record


UNFINDABLE = re.compile(r"qzxvw|unfindable", re.I)


def corpus_documents(n: int = 12) -> list[Document]:
    docs = [Document(f"k{i}", keeper(i), f"{keeper(i)} is the keeper of zorvath{i}. {FILLER}") for i in range(n)]
    return docs + [Document(f"f{i}", f"Ledger {i}", f"Ledger number {i} of the valley. {FILLER}") for i in range(4)]


def write_jsonl(path: Path, records) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


class ReaderAgent:
    """Search every question in order; answer each with the first hit's title (module docstring)."""

    def respond(self, messages):
        questions = parse_episode_prompt(messages[1]["content"])
        last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=None)
        found = []
        if last is not None:
            mem = parse_round(messages[last]["content"]).mem or ""
            found = [a for a in mem.split("found:", 1)[-1].split("|") if a.strip()] if "found:" in mem else []
            found = [a.strip() for a in found]
            tool = messages[last + 1]["content"] if last + 1 < len(messages) else ""
            hit = re.search(r"Doc 1 \(ID: [^,]*, Title: ([^)]*)\)", tool)
            found.append(hit.group(1) if hit else "unknown")
        mem = "found: " + " | ".join(found) if found else "nothing found yet"
        if len(found) == len(questions):
            return f"<mem>{mem}</mem>\n<think>\nall found\n</think>\n<answer>{'; '.join(found)}</answer>"
        return (f"<mem>{mem}</mem>\n<think>\nnext question\n</think>\n"
                f"<search>{questions[len(found)]}</search>")


class Recording:
    """A backend wrapper that keeps every generation request it forwards."""

    def __init__(self, inner):
        self.inner, self.requests, self.name = inner, [], "recording"

    def generate(self, requests, sampling):
        self.requests.extend(requests)
        return self.inner.generate(requests, sampling)


def reader_backend(tok):
    return OracleBackend(tok, agent=ReaderAgent())


def make_cfg(tmp_path, files, *, objectives=(1, 2), episodes=4, policies=("memory", "full"), max_turns=8, **env):
    env = {"corpus_path": str(tmp_path / "corpus.jsonl"), "topk": 2, "doc_chars": 500, **env}
    return config_from_dict({"data": {"source": "files", "eval_files": [str(f) for f in files]}, "env": env,
                             "rollout": {"max_new_tokens_per_round": 400},
                             "eval": {"objectives": list(objectives), "episodes": episodes,
                                      "policies": list(policies), "max_turns": max_turns}})


def write_qa_files(tmp_path):
    """qa.jsonl: dataset 'alpha' (answerable) and 'beta' (unanswerable) by data_source;
    mixed.jsonl: no data_source, dataset 'mixed' (both kinds); the corpus."""
    write_corpus(tmp_path / "corpus.jsonl", corpus_documents())
    qa = write_jsonl(tmp_path / "qa.jsonl", [answerable(i, "alpha") for i in range(4)]
                     + [unanswerable(i, "beta") for i in range(3)])
    mixed = write_jsonl(tmp_path / "mixed.jsonl", [answerable(i) for i in range(4, 8)] + [unanswerable(i)
                                                                                           for i in range(3, 6)])
    return qa, mixed


def expected_em(episode) -> float:
    """The reader's EM on an episode: the share of its questions that are answerable."""
    return sum(source.startswith("a") for source in episode.source_ids) / len(episode.source_ids)


def save_tiny_model_dir(path):
    """A tiny random Qwen2 and its own byte-level BPE, saved with save_pretrained (a plain HF directory)."""
    from mempo.model.builtin import tiny_model, train_tokenizer

    texts = [f"{d.title}\n{d.text}" for d in corpus_documents()] + [answerable(i)["question"] for i in range(8)]
    tok = train_tokenizer(texts, vocab_size=600)
    tiny_model(tok, seed=0).save_pretrained(path)
    tok.save_pretrained(path)
    return path
