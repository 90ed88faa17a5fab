"""A tiny random Qwen2 model and a byte-level BPE tokenizer, built in-process (no download)."""

from __future__ import annotations

from functools import lru_cache

CORPUS = [
    "def sort_numbers(xs):\n    return xs\n",
    "    result = []\n    for x in xs:\n        result.append(x)\n    return result\n",
    "print(2 + 2)\nprint('hello')\n",
]


@lru_cache(maxsize=1)
def tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320, special_tokens=["<pad>", "<eos>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS * 10, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", padding_side="left")


def chat_tokenizer(chat_template: str, corpus: tuple[str, ...] = ()):
    """A byte-level BPE tokenizer with ChatML's special tokens and ``chat_template`` (e.g. Qwen2.5's)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600, special_tokens=["<pad>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(list(corpus or CORPUS) * 10, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<|im_end|>",
                                   padding_side="left")
    fast.chat_template = chat_template
    return fast


def model(seed: int = 0, tokenizer=None, max_position_embeddings: int = 512):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = tokenizer or globals()["tokenizer"]()
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
