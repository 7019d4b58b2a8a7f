"""A small batch of hand-made multi-round trajectories with `<information>` texts and a word-level
tokenizer (the memory-pooling tests: tests/algo/test_pooling.py, tests/train/test_step.py)."""
from mempo.records.trajectory import Round, Trajectory

GOLDS = [["Paris"], ["Rome"]]


class WordTokenizer:
    """One id per word; decode joins the words with spaces."""

    def __init__(self):
        self.words: list[str] = []

    def ids(self, text: str) -> list[int]:
        out = []
        for word in text.split():
            if word not in self.words:
                self.words.append(word)
            out.append(self.words.index(word))
        return out

    def decode(self, ids, skip_special_tokens=False):
        return " ".join(self.words[i] for i in ids)


TOK = WordTokenizer()


def episode(uid, sample, rounds, golds=GOLDS):
    """rounds: [(mem text or None, rest of the round, tool text or None)]; every round after the
    first with a mem text is scored."""
    response, made = [], []
    prompt = TOK.ids("question")
    for index, (mem, rest, tool) in enumerate(rounds):
        start = len(response)
        mem_span = None
        if mem is not None:
            response += TOK.ids(f"<mem> {mem} </mem>")
            mem_span = (start, len(response))
        response += TOK.ids(rest)
        end = len(response)
        information = None
        if tool is not None:
            response += TOK.ids(f"<information> {tool} </information>")
            information = (end, len(response))
        made.append(Round(index=index, start=start, end=end, tool_end=len(response), full_end=len(prompt) + start,
                          mem_span=mem_span, information=information))
    t = Trajectory(uid=uid, sample_index=sample, policy="full", prompt_ids=prompt, response_ids=response,
                   response_mask=[1] * len(response), rounds=made, finish_reason="answer", golds=golds)
    t.validate()
    return t


def batch():
    """Group q: sample 0 reads Paris, then Rome (two scored rounds, seen 1 and 2); sample 1 reads
    nothing useful, then Paris, then Rome (scored rounds 1 and 3, seen 0 and 2); group r: one
    trajectory with one scored round (seen 1). Outcome scores 1, 0, 1."""
    first = episode("q", 0, [("Q1 ? Q2 ?", "search a", "Paris is the city"),
                             ("Q1 paris Q2 ?", "search b", "Rome is the town"),
                             ("Q1 paris Q2 rome", "answer", None)])
    second = episode("q", 1, [("Q1 ? Q2 ?", "search a", "nothing here"),
                              ("Q1 ? Q2 ?", "search c", "Paris again"),
                              (None, "search d", "Rome here"),
                              ("Q1 ? Q2 ?", "answer", None)])
    third = episode("r", 0, [("Q1 ? Q2 ?", "search a", "Rome"), ("Q2 rome", "answer", None)])
    for t, score in zip((first, second, third), (1.0, 0.0, 1.0)):
        t.outcome = {"score": score}
    return [first, second, third]
