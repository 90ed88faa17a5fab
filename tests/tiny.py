"""A tiny random Qwen2 model and a byte-level BPE tokenizer, built in-process (no download)."""

from __future__ import annotations

from functools import lru_cache

CORPUS = [
    "def sort_numbers(xs):\n    return xs\n",
    "    result = []\n    for x in xs:\n        result.append(x)\n    return result\n",
    "print(2 + 2)\nprint('hello')\n",
]


def _byte_bpe(corpus, vocab_size: int, special_tokens: list[str], eos: str):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=special_tokens, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(list(corpus) * 10, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token=eos, padding_side="left")


@lru_cache(maxsize=1)
def tokenizer():
    return _byte_bpe(CORPUS, 320, ["<pad>", "<eos>"], "<eos>")


def chat_tokenizer(chat_template: str, corpus: tuple[str, ...] = ()):
    """A byte-level BPE tokenizer with ChatML's special tokens and ``chat_template`` (e.g. Qwen2.5's)."""
    fast = _byte_bpe(corpus or CORPUS, 600, ["<pad>", "<|im_start|>", "<|im_end|>"], "<|im_end|>")
    fast.chat_template = chat_template
    return fast


def model(seed: int = 0, tok=None, max_position_embeddings: int = 512):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = tok or tokenizer()
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=max_position_embeddings, pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id, tie_word_embeddings=True,
    )
    return Qwen2ForCausalLM(config)


def grpo_kwargs(output_dir, **overrides):
    """SandboxGRPOConfig arguments for a fast CPU run."""
    kwargs = dict(
        output_dir=str(output_dir), use_cpu=True, bf16=False, gradient_checkpointing=False,
        per_device_train_batch_size=4, num_generations=2, max_completion_length=12, max_steps=2,
        learning_rate=1e-4, logging_steps=1, save_strategy="no", report_to="none", seed=0,
        dataloader_num_workers=0,
    )
    kwargs.update(overrides)
    return kwargs
