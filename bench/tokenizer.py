"""Byte-level BPE tokenizer for the embedded model family, saved in Hugging Face format."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

BOS = "<|endoftext|>"
PAD = "<|pad|>"


def train_bpe_tokenizer(texts: Iterable[str], out_dir: Path, *, vocab_size: int = 8192,
                        min_frequency: int = 2) -> None:
    """Train a byte-level BPE on ``texts`` and save it as a ``PreTrainedTokenizerFast`` directory."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer(add_prefix_space=False)
    bpe.train_from_iterator(texts, vocab_size=vocab_size, min_frequency=min_frequency,
                            special_tokens=[BOS, PAD], show_progress=False)
    fast = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token=BOS, eos_token=BOS,
                                   unk_token=None, pad_token=PAD, model_max_length=1 << 20)
    fast.save_pretrained(out_dir)
