"""A real TRL tool-calling run with ``environment_factory=SandboxEnvironment`` on the local sandbox.

A random model never emits a tool call, so the tiny model is first overfitted to answer the
prompt with one ``write_file`` call in Qwen2.5's format (the chat template TRL ships and knows
how to parse). GRPO then has TRL parse that call, run the tool in a bubblewrap sandbox held for
the episode, and score the file the episode left through ``get_reward``: a reward of 1.0 can
only come from that whole path working.
"""

from __future__ import annotations

import asyncio
import json
import os

import pytest
from datasets import Dataset

from tests import tiny
from trl_sandbox import SandboxEnvironment, SandboxGRPOConfig, SandboxGRPOTrainer
from trl_sandbox.training.environment import JUDGE_HEADROOM

PROMPT = [{"role": "user", "content": "Put an expression equal to 4 in answer.txt."}]
CALL = {"name": "write_file", "arguments": {"path": "answer.txt", "content": "2+2"}}
COMPLETION = "<tool_call>\n" + json.dumps(CALL) + "\n</tool_call><|im_end|>"
AFTER_TOOL = "done<|im_end|>"
ROW = {"prompt": PROMPT, "sandbox_task": "echo", "task_id": "four", "expected": "4", "solution_path": "answer.txt"}


def _tools() -> list:
    """The environment's tools in TRL's order (by name)."""
    env = SandboxEnvironment()
    return [getattr(env, name) for name in sorted(("bash", "read_file", "run_tests", "write_file"))]


def _rendered(tokenizer) -> tuple[str, str]:
    """The prompt as TRL renders it, and the transcript after the tool answered."""
    prompt = tokenizer.apply_chat_template(PROMPT, tools=_tools(), add_generation_prompt=True, tokenize=False)
    tool_turn = "<|im_start|>user\n<tool_response>\nwrote 3 characters to answer.txt\n</tool_response><|im_end|>\n"
    return prompt, prompt + COMPLETION + "\n" + tool_turn + "<|im_start|>assistant\n"


def _overfit(model, tokenizer, steps: int = 400) -> None:
    """Teach the model the two assistant turns (loss on those tokens only), with the CPU demo's warm start."""
    from trl_sandbox.training.presets.cpu_demo import WarmStartSettings, supervised_pass

    prompt, after = _rendered(tokenizer)
    examples = [
        (tokenizer(context, add_special_tokens=False)["input_ids"], tokenizer(answer, add_special_tokens=False)["input_ids"])
        for context, answer in ((prompt, COMPLETION), (after, AFTER_TOOL))
    ]
    supervised_pass(model, tokenizer, examples, WarmStartSettings(steps=steps, batch_size=2), progress=False)
    model.eval()
    ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
    out = model.generate(ids, max_new_tokens=60, do_sample=False, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    said = tokenizer.decode(out[0, ids.shape[1]:])
    assert said == COMPLETION, f"the warm start did not take: {said!r}"


@pytest.mark.slow
def test_grpo_with_sandbox_environment_runs_the_tool_and_scores_the_episode(tmp_path):
    from trl.chat_template_utils import qwen2_5_chat_template

    tokenizer = tiny.chat_tokenizer(qwen2_5_chat_template, _rendered(tiny.chat_tokenizer(qwen2_5_chat_template)))
    model = tiny.model(tok=tokenizer, max_position_embeddings=4096)
    _overfit(model, tokenizer)

    args = SandboxGRPOConfig(
        **tiny.grpo_kwargs(tmp_path, per_device_train_batch_size=4, num_generations=2, max_steps=2,
                           max_completion_length=200, temperature=0.05, learning_rate=1e-6),
        max_tool_calling_iterations=1, sandbox_pool_size=1,
    )
    trainer = SandboxGRPOTrainer(model=model, args=args, train_dataset=Dataset.from_list([ROW] * 8),
                                 processing_class=tokenizer, environment_factory=SandboxEnvironment)
    trainer.train()

    logs = [r for r in trainer.state.log_history if "rewards/SandboxEnvironment/mean" in r]
    assert len(logs) == 2
    assert all(r["rewards/SandboxEnvironment/mean"] == 1.0 for r in logs), logs
    assert all(r["tools/call_frequency"] > 0 and r["tools/failure_frequency"] == 0 for r in logs), logs
    assert all(r["sandbox/passed"] == 4 and r["sandbox/pass_rate"] == 1.0 and r["sandbox/infra"] == 0 for r in logs)
    # Each of the batch's four episodes held a sandbox of its own, and the judge had room beside them.
    assert trainer.sandbox_pool.size == 4 + JUDGE_HEADROOM
    assert trainer.sandbox_pool.members == 0, "the pool is torn down after training"
    assert asyncio.run(trainer.sandbox_pool.provider.list({})) == []
    assert os.path.exists(tmp_path / "metrics.jsonl")
