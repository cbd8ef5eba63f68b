"""Prompts that cannot fit the model's context, found before any engine call (docs/design.md "Failed episodes").

The model directory's tokenizer counts each prompt's tokens as vLLM does for a text prompt (with
the tokenizer's special tokens, e.g. a BOS). The context is ``engine.max_model_len`` when set,
else the model's ``max_position_embeddings`` (config.json). A prompt of ``context`` tokens or more
cannot be served: vLLM refuses a prompt longer than the context, and one of exactly the context's
length too, since it leaves no room for one generated token. A prompt that fits but leaves fewer
than ``max_tokens`` tokens is served: its generation stops at the context (finish_reason length).

``task.on_overlong`` says what happens to such a prompt: ``error`` (BadInput naming the items,
before the model loads), ``fail_episode`` (the episode is recorded as failed without an engine
call) or ``truncate_left`` (the prompt keeps its last ``context - 1`` tokens, decoded back to text;
the chain records the prompt sent). Staged episodes (few-shot, multiple choice, judges) are
checked on their policy prompt only.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from evalrun.config import TRUNCATE_LEFT
from evalrun.episodes.plan import Plan, PlannedItem
from evalrun.errors import BadInput

TOKENIZER_FILE = "tokenizer.json"


def context_length(model_path: Path, max_model_len: int | None) -> int | None:
    """The engine's context in tokens; None when neither the setting nor config.json says."""
    if max_model_len:
        return max_model_len
    try:
        config = json.loads((model_path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    value = config.get("max_position_embeddings") if isinstance(config, dict) else None
    return value if isinstance(value, int) and value > 0 else None


def load_tokenizer(model_path: Path) -> Any | None:
    """The model directory's fast tokenizer (tokenizer.json), or None when it has none."""
    path = model_path / TOKENIZER_FILE
    if not path.is_file():
        return None
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path))


def apply_context_limit(plan: Plan, model_path: Path, max_model_len: int | None, on_overlong: str) -> Plan:
    """The plan with every prompt that cannot fit handled as ``on_overlong`` says; unchanged when the
    context or the tokenizer is unknown (the engine then refuses such a request itself)."""
    context = context_length(model_path, max_model_len)
    tokenizer = load_tokenizer(model_path) if context is not None else None
    if context is None or tokenizer is None:
        return plan
    prompts = sorted({planned.prompt for planned in plan.items})
    add = plan.add_special_tokens  # as the engine will tokenize them (a chat template writes its own BOS)
    counts = dict(zip(prompts, (len(enc.ids) for enc in tokenizer.encode_batch(prompts, add_special_tokens=add)),
                      strict=True))  # fmt: skip
    overlong = [planned for planned in plan.items if counts[planned.prompt] >= context]
    if not overlong:
        return plan
    if on_overlong == "error":
        items = sorted({planned.item.id for planned in overlong})
        shown = ", ".join(items[:10]) + (f" and {len(items) - 10} more" if len(items) > 10 else "")
        raise BadInput(
            "task.on_overlong",
            f"{len(items)} items have prompts of {context} tokens or more, the model's context: {shown} "
            "(task.on_overlong=fail_episode records them as failed episodes, truncate_left shortens them)",
        )

    def fitted(planned: PlannedItem) -> PlannedItem:
        if counts[planned.prompt] < context:
            return planned
        if on_overlong == TRUNCATE_LEFT:
            return replace(planned, prompt=_keep_last_tokens(tokenizer, planned.prompt, context - 1, add))
        reason = (
            f"prompt of {counts[planned.prompt]} tokens does not fit the model's context of {context} tokens "
            "(task.on_overlong=fail_episode)"
        )
        return replace(planned, rejection=reason)

    return plan.with_items(tuple(fitted(planned) for planned in plan.items))


def _keep_last_tokens(tokenizer: Any, prompt: str, keep: int, add_special_tokens: bool = True) -> str:
    """The prompt's text from the token where its last ``keep`` tokens (special tokens aside) begin.

    Cut at a token's character offset, so the text is the prompt's own; the cut is moved right
    until the text's token count fits (a re-tokenised suffix may merge differently).
    """
    encoding = tokenizer.encode(prompt, add_special_tokens=add_special_tokens)
    starts = [start for (start, end), special in zip(encoding.offsets, encoding.special_tokens_mask, strict=True)
              if not special and end > start]  # fmt: skip
    for index in range(max(0, len(starts) - keep), len(starts)):
        text = prompt[starts[index] :]
        if len(tokenizer.encode(text, add_special_tokens=add_special_tokens).ids) <= keep:
            return text
    return ""
