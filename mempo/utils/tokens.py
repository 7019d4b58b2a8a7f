"""Tokenizer helpers shared by every layer: encode / decode with a transformers tokenizer or a
``tokenizers.Tokenizer`` alike (no special tokens added, none dropped, no clean-up)."""
from __future__ import annotations

from typing import Any, Sequence

__all__ = ["is_transformers_tokenizer", "encode_text", "decode_ids"]


def is_transformers_tokenizer(tokenizer: Any) -> bool:
    """A transformers tokenizer (else a ``tokenizers.Tokenizer``, whose ``encode`` returns an Encoding)."""
    return hasattr(tokenizer, "apply_chat_template") or hasattr(tokenizer, "convert_tokens_to_ids")


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """Ids of ``text`` without added special tokens (a transformers tokenizer or a ``tokenizers.Tokenizer``)."""
    if not text:
        return []
    if is_transformers_tokenizer(tokenizer):
        return list(tokenizer.encode(text, add_special_tokens=False))
    return list(tokenizer.encode(text, add_special_tokens=False).ids)


def decode_ids(tokenizer: Any, ids: Sequence[int]) -> str:
    """Text of ``ids`` with special tokens kept and no clean-up."""
    ids = [int(i) for i in ids]
    if is_transformers_tokenizer(tokenizer):
        return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    return tokenizer.decode(ids, skip_special_tokens=False)
