"""Prompt templates: how an environment observation becomes the policy's prompt text.

``qwen3_game`` and ``qwen3_general`` are the formats of Gem's oat training scripts (used for the paper's Gem runs);
``plain`` passes the observation through (for tiny policies trained on compact observations); ``chat`` uses the
tokenizer's own chat template.
"""

from __future__ import annotations

from collections.abc import Callable

from dppo_oat.settings.spec import TEMPLATES

QWEN3_GAME = (
    "<|im_start|>user\nYou are playing language games. Make valid actions to win.\nObservation: {observation}"
    "\nPlease reason step by step, and put your final answer within \\boxed{{}}.<|im_end|>\n<|im_start|>assistant\n"
)
QWEN3_GENERAL = (
    "<|im_start|>user\nQuestion: {observation}"
    "\nPlease reason step by step, and put your final answer within \\boxed{{}}.<|im_end|>\n<|im_start|>assistant\n"
)


def render_prompt(template: str, observation: str, tokenizer=None) -> str:
    """The prompt text for ``observation`` under ``template`` (``chat`` needs the tokenizer)."""
    if template == "qwen3_game":
        return QWEN3_GAME.format(observation=observation)
    if template == "qwen3_general":
        return QWEN3_GENERAL.format(observation=observation)
    if template == "plain":
        return observation
    if template == "chat":
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            raise ValueError("template 'chat' needs a tokenizer with a chat template")
        messages = [{"role": "user", "content": observation}]
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    raise ValueError(f"unknown prompt template {template!r}; choose one of: {', '.join(TEMPLATES)}")


def template_renderer(template: str, tokenizer=None) -> Callable[[str], str]:
    """``render_prompt`` with the template fixed (validated now, not at the first observation)."""
    if template not in TEMPLATES:
        raise ValueError(f"unknown prompt template {template!r}; choose one of: {', '.join(TEMPLATES)}")
    if template == "chat":
        render_prompt(template, "", tokenizer)
    return lambda observation: render_prompt(template, observation, tokenizer)
