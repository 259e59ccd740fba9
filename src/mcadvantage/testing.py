"""Tiny offline models and tokenizers for tests, examples and the CPU demo.

Nothing here downloads anything: the tokenizer is a character-level ``tokenizers`` model (a BPE with
no merges, so every character is one token) wrapped in ``PreTrainedTokenizerFast``, and the model is
a randomly initialised Llama. They are small enough to train on a laptop CPU and large enough for
vLLM's CPU attention kernel (head_dim 64 by default: head_dim 16 is rejected there).
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

# Printable ASCII (letters, digits, punctuation, space) plus newline and tab: enough for GSM8K-style
# arithmetic, LaTeX answers and the demo's prompts.
DEFAULT_ALPHABET = string.printable.replace("\x0b", "").replace("\x0c", "").replace("\r", "")

PAD_TOKEN = "<pad>"
BOS_TOKEN = "<s>"
EOS_TOKEN = "</s>"
UNK_TOKEN = "<unk>"


def build_char_tokenizer(alphabet: str = DEFAULT_ALPHABET, *, chat_template: bool = True) -> Any:
    """A character-level ``PreTrainedTokenizerFast``: one token per character, built offline.

    Special tokens: ``<pad>`` (0), ``<s>`` (1), ``</s>`` (2, EOS), ``<unk>`` (3). Characters outside
    ``alphabet`` map to ``<unk>``. With ``chat_template=True`` a minimal chat template is set so the
    tokenizer also serves conversational datasets.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = [PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN]
    chars = list(dict.fromkeys(alphabet))  # dedupe, keep order
    vocab = {tok: i for i, tok in enumerate(specials + chars)}
    # A BPE with no merges is a pure character vocabulary; Split on "" keeps every character
    # (including spaces and newlines) as its own token, and Fuse() concatenates them back on decode.
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK_TOKEN))
    backend.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
    )
    if chat_template:
        tokenizer.chat_template = (
            "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant: {% endif %}"
        )
    return tokenizer


def build_tiny_llama(
    tokenizer: Any,
    *,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 2,
    head_dim: int = 64,
    intermediate_size: int = 256,
    max_position_embeddings: int = 512,
    seed: int = 0,
) -> Any:
    """A randomly initialised ``LlamaForCausalLM`` sized for ``tokenizer`` (float32, CPU)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    return model


def save_tiny_model(path: str | Path, **model_kwargs: Any) -> Path:
    """Build a character tokenizer and a tiny Llama and save both to ``path`` (a model directory
    that ``from_pretrained``, TRL trainers and ``vllm.LLM`` accept). Returns the path."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = build_char_tokenizer()
    model = build_tiny_llama(tokenizer, **model_kwargs)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
