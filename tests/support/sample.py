"""Sample generations with true ids from a local target model, shaped like a vLLM server's rows.

Simulate mode needs rows whose ids are known; this makes them offline (tests, the re-encode benchmark).
"""

from __future__ import annotations

import json

import torch

from tasks.target_model.tokens import EndOfTurn, codec


@torch.no_grad()
def sample_generations(
    model,
    tokenizer,
    prompts: list[list[dict]],
    end_of_turn: EndOfTurn,
    source: str = "sampled",
    max_new_tokens: int = 64,
    temperature: float = 0.7,
    batch_size: int = 16,
    seed: int = 0,
) -> list[dict]:
    """One generations row per prompt: text channels, prompt/completion ids and logprob entries."""
    torch.manual_seed(seed)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else end_of_turn.id
    rows = []
    for b in range(0, len(prompts), batch_size):
        batch = prompts[b : b + batch_size]
        texts = tokenizer.apply_chat_template(batch, tokenize=False, add_generation_prompt=True)
        tokens = codec(tokenizer)
        encoded = tokens.encode_batch(texts)
        width = max(len(e) for e in encoded)
        input_ids = torch.tensor([[pad] * (width - len(e)) + e for e in encoded])  # (B, P) left-padded
        attention = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in encoded])
        out = model.generate(
            input_ids=input_ids,
            attention_mask=attention,
            do_sample=temperature > 0,
            temperature=temperature,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_new_tokens,
            eos_token_id=end_of_turn.id,
            pad_token_id=pad,
            output_logits=True,
            return_dict_in_generate=True,
        )
        logprobs = torch.log_softmax(torch.stack(out.logits, dim=1).float(), dim=-1)  # (B, N, V)
        for i, prompt_ids in enumerate(encoded):
            completion = out.sequences[i, width:].tolist()
            finish = "length"
            if end_of_turn.id in completion:
                completion = completion[: completion.index(end_of_turn.id) + 1]
                finish = "stop"
            entries = []
            for k, token_id in enumerate(completion):
                raw = tokens.bytes_of(token_id)
                text = raw.decode("utf-8", errors="replace")
                entries.append({"token": text, "bytes": raw, "logprob": float(logprobs[i, k, token_id])})
            body = completion[:-1] if finish == "stop" else completion
            rows.append(
                {
                    "id": f"{source}-{b + i:06d}",
                    "source": source,
                    "messages": json.dumps(batch[i], ensure_ascii=False),
                    "tools": None,
                    "reasoning": None,
                    "content": tokens.decode(body),
                    "tool_calls": None,
                    "finish_reason": finish,
                    "truncated": finish == "length",
                    "prompt_tokens": len(prompt_ids),
                    "completion_tokens": len(completion),
                    "model": "local",
                    "provider": "local",
                    "prompt_token_ids": prompt_ids,
                    "token_ids": completion,
                    "logprob_tokens": entries,
                }
            )
    return rows
