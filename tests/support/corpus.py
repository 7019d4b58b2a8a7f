"""The small deterministic retrieval corpus shared by the retrieval, server and tools tests."""
import random

from mempo.env.corpus import Document

FILLER = ("river stone market harbor lantern orchard meadow bridge tower valley forest garden engine signal "
          "archive ledger compass mirror window candle").split()
LONG_DOC_CHARS = 60_000  # three pages of 25,000 characters


def make_corpus(num_docs: int = 300, seed: int = 0) -> list[Document]:
    """Deterministic corpus: filler documents, needle documents `needle-i` holding the unique word
    `zebulon<i>` (i < 10), and long documents `long-i` (i < 3) of LONG_DOC_CHARS characters."""
    rng = random.Random(seed)
    docs = []
    for i in range(num_docs):
        words = rng.choices(FILLER, k=rng.randint(20, 80))
        if i < 10:
            doc_id, title = f"needle-{i}", f"Needle {i}"
            words[rng.randrange(len(words))] = f"zebulon{i}"
        elif i < 13:
            doc_id, title = f"long-{i - 10}", f"Long {i - 10}"
        else:
            doc_id, title = f"doc-{i}", f"Document {i}"
        text = " ".join(words)
        if doc_id.startswith("long-"):
            text = (f"start of long {i - 10}. " + text + " ") * (LONG_DOC_CHARS // len(text) + 1)
            text = text[:LONG_DOC_CHARS]
        docs.append(Document(doc_id, title, text))
    return docs
