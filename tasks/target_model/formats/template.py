"""A generated turn as the target's own chat template writes it (`chat_format: template`), for any template.

The completion is what the template renders after the generation prompt once the reply is appended as the
assistant turn, up to and including its end-of-turn token. Templates are written for inference and may drop a
past turn's reasoning or never render tool calls: each row is checked to carry every channel of its reply, and a
row whose channel the template drops is refused with that reason, never rebuilt without it. Probes of the
template at load time give the per-feature table preflight prints, and the shapes `parse` splits text back by.
Family modules (`formats/`) win where one matches: they also parse tool calls back and keep the model's ids.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace

from tasks.target_model.formats.base import ChatFormat, Reply, RowError, ToolCall, json_arguments

CONTENT, CONTENT_2, REASONING, VALUE = "Zq7content", "Zq7second", "Zq7reasoning", "zq7value"
PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": "zq7_tool",
        "description": "probe",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
    },
}
PROBE_CALL = ToolCall("zq7_tool", json.dumps({"q": VALUE}), "a1b2c3d4e")  # 9 alphanumerics: Mistral's templates ask that
USER, USER_2 = {"role": "user", "content": "Zq7question"}, {"role": "user", "content": "Zq7again"}
# Template switches that turn reasoning on or off in the families that have them; the probes try each.
THINKING_KWARGS = ({}, {"enable_thinking": True}, {"thinking": True}, {"enable_thinking": False}, {"thinking": False})


def assistant_message(reply: Reply, row_id: str) -> dict:
    """The reply as a chat template reads the assistant turn (arguments as objects, reasoning under both names)."""
    message: dict = {"role": "assistant", "content": reply.content}
    if reply.reasoning:
        message |= {"reasoning_content": reply.reasoning, "reasoning": reply.reasoning}
    if reply.tool_calls:
        message["tool_calls"] = [
            {"id": call.id or f"call{k:05d}", "type": "function", "function": {"name": call.name, "arguments": arguments}}
            for k, (call, arguments) in enumerate((c, json_arguments(c, row_id)) for c in reply.tool_calls)
        ]
    return message


def common_prefix(a: str, b: str, added: list[str]) -> int:
    """Characters `a` and `b` share from the start, backed off to the start of an added token cut in two."""
    at = len(os.path.commonprefix([a, b]))
    for token in added:
        start = a.find(token, max(0, at - len(token) + 1))
        if 0 <= start < at < start + len(token):
            at = start
    return at


@dataclass(frozen=True)
class Probe:
    """One feature's verdict: ok, or why not."""

    feature: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class TemplateFormat(ChatFormat):
    tokenizer: object = field(default=None, compare=False, repr=False)
    end_markers: tuple[str, ...] = ()  # tokens that close a turn in the template's rendering (last one found wins)
    # Shapes of a turn by how the generation prompt ends (its text after the user's): (opening, before, between, after)
    # around the reasoning and the content, and (opening, before, after) around the content of a turn without reasoning.
    reasoning_shapes: tuple[tuple[str, str, str, str], ...] = ()
    text_shapes: tuple[tuple[str, str, str], ...] = ()
    probes: tuple[Probe, ...] = ()

    # ---------------------------------------------------------------- writing a turn
    def render(self, messages: list[dict], tools, kwargs: dict, generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=generation_prompt, **kwargs
        )

    def safe_render(self, messages: list[dict], generation_prompt: bool) -> str:
        """A probe rendered without tools or switches; '' where the template refuses it."""
        try:
            return self.render(messages, None, {}, generation_prompt)
        except Exception:  # a template may refuse a second user turn, or mutate what its sandbox forbids
            return ""

    def turn_text(self, reply: Reply, prompt: str, history: list[dict], tools, kwargs: dict, row_id: str) -> str:
        """What the template writes after `prompt` for this reply, through its end-of-turn token."""
        from tasks.target_model.chat import template_messages

        full = self.render([*template_messages(history), assistant_message(reply, row_id)], tools, kwargs, False)
        tail = self.after_prompt(full, prompt, bool(reply.reasoning))
        if tail is None:
            prefill = prompt[common_prefix(full, prompt, self.added_tokens) :]
            raise RowError(
                "template_mismatch",
                "messages",
                f"row {row_id!r}: the chat template renders this turn without the end of its generation prompt "
                f"({prefill!r}), so what the model wrote after it is unknown",
            )
        return self.through_end(tail, row_id)

    def after_prompt(self, full: str, prompt: str, reasoning: bool) -> str | None:
        """What `full` writes after the generation prompt `prompt`. A prompt may end in a prefilled empty block that
        the history omits (thinking off): a reply without reasoning follows it. None: `full` does not extend it."""
        if full.startswith(prompt):
            return full[len(prompt) :]
        shared = common_prefix(full, prompt, self.added_tokens)
        prefill = prompt[shared:]
        closed = sum(prefill.count(token) for token in self.added_tokens) >= 2  # opens and closes a block
        return full[shared:] if closed and not reasoning else None

    @property
    def added_tokens(self) -> list[str]:
        from tasks.target_model.tokens import codec

        return [t for t in codec(self.tokenizer).added if t]

    def through_end(self, tail: str, row_id: str) -> str:
        """The rendered tail cut after its last end-of-turn token (what follows is the template's separator)."""
        stop = max((tail.rfind(m) + len(m) for m in self.end_markers if m in tail), default=-1)
        if stop < 0:
            raise RowError(
                "template_mismatch", "messages", f"row {row_id!r}: the chat template wrote no end-of-turn token after this turn"
            )
        return tail[:stop]

    def completion(self, reply: Reply, prompt: str, history: list[dict], row_id: str = "", request: dict | None = None) -> str:
        request = request or {}
        text = self.turn_text(reply, prompt, history, request.get("tools"), request.get("template_kwargs") or {}, row_id)
        self.check_channels(reply, text, row_id)
        if not reply.truncated:
            return text
        if reply.tool_calls:
            raise RowError("template_cannot_render", "tool_calls", f"row {row_id!r}: a cut-off reply with tool calls")
        last = reply.content if reply.content.strip() else reply.reasoning or ""
        at = text.rfind(last.strip())
        return text[: at + len(last.strip())] + last[len(last.rstrip()) :]

    def check_channels(self, reply: Reply, text: str, row_id: str) -> None:
        """Every channel of the reply is in the template's text of it, or RowError naming the one it dropped."""
        dropped = [
            (name, what)
            for name, what, value in (
                ("reasoning", "the reasoning", reply.reasoning),
                ("content", "the content", reply.content),
                *(("tool_calls", f"the call to {c.name}", c.name) for c in reply.tool_calls),
            )
            if value and value.strip() and value.strip() not in text
        ]
        if dropped:
            name, what = dropped[0]
            why = f"row {row_id!r}: the chat template does not write {what} of this turn"
            raise RowError("template_cannot_render", name, why)

    def reasoning_bounds(self, reply: Reply, prompt: str, completion: str, row_id: str) -> tuple[int, int, int] | None:
        """(start, stop, block end) of the reasoning in the written turn; the block ends where the content's shape
        begins (None: no reasoning)."""
        if not reply.reasoning:
            return None
        start = completion.find(reply.reasoning)
        stop = start + len(reply.reasoning)
        between = next((mid for _, _, mid, _ in self.reasoning_shapes if completion.startswith(mid, stop)), "")
        return start, stop, stop + len(between)

    # ---------------------------------------------------------------- reading a turn back
    def parse(self, text: str, prompt: str) -> Reply:
        """Decoded completion (end-of-turn token removed) -> channels, by the shapes the probes rendered after a
        generation prompt that ends as this one does; tool calls stay in the content (a family module parses them)."""
        reasoning = [shape[1:] for shape in self.reasoning_shapes if prompt.endswith(shape[0])]
        for before, between, after in reasoning:
            if text.startswith(before) and between in text[len(before) :]:
                thought, _, rest = text[len(before) :].partition(between)
                return Reply(thought, rest.removesuffix(after))
        for opening, before, after in self.text_shapes:
            if prompt.endswith(opening) and text.startswith(before):
                return Reply(None, text[len(before) :].removesuffix(after))
        for before, _, _ in reasoning:  # cut off inside the reasoning
            if text.startswith(before):
                return Reply(text[len(before) :], "")
        return Reply(None, text)

    @property
    def markers(self) -> list[str]:
        return list(self.end_markers)


def template_format(tokenizer) -> TemplateFormat:
    """The tokenizer's own chat template as a chat format, probed once per template (kept on the tokenizer)."""
    template = tokenizer.chat_template
    kept = getattr(tokenizer, "_draftsmith_template_format", None)
    if kept is not None and kept[0] == template:
        return kept[1]
    fmt = probe_template(tokenizer)
    tokenizer._draftsmith_template_format = (template, fmt)
    return fmt


def probe_template(tokenizer) -> TemplateFormat:
    """Render probe turns through the template: the end-of-turn tokens, the shapes of a turn, each feature's verdict."""
    base = TemplateFormat(name="template", end_of_turn="", tokenizer=tokenizer)

    def tail(reply: Reply, kwargs: dict, tools=None, history: tuple = ()) -> str | None:
        """What the template writes after the generation prompt for the reply; None: nothing it can be told from."""
        messages = [*history, USER]
        try:
            prompt = base.render(messages, tools, kwargs, True)
            full = base.render([*messages, assistant_message(reply, "probe")], tools, kwargs, False)
        except Exception:  # a template may refuse a probe (tools, a kwarg it checks, a second turn)
            return None
        return base.after_prompt(full, prompt, bool(reply.reasoning))

    def either(content: str, calls: tuple = (), tools=None, history: tuple = ()) -> str | None:
        """The tail of a plain reply, else of one with reasoning (a generation prompt may open a reasoning block)."""
        tails = (tail(Reply(reasoning, content, calls), {}, tools, history) for reasoning in (None, REASONING))
        return next((t for t in tails if t and content in t and all(c.name in t for c in calls)), None)

    earlier = (USER, {"role": "assistant", "content": CONTENT})
    text_tail, second_tail = either(CONTENT), either(CONTENT_2, history=earlier)
    # Calls beside content, else alone (a template may write a tool-call turn without its content, as Mistral's does).
    call_tail = either(CONTENT, (PROBE_CALL,), [PROBE_TOOL]) or either("", (PROBE_CALL,), [PROBE_TOOL])
    end = end_of_turn(base, text_tail)
    end_markers = tuple(dict.fromkeys(m for m in (end, last_added(base, call_tail)) if m))
    plain, thought = Reply(None, CONTENT), Reply(REASONING, CONTENT)

    text_shapes, reasoning_shapes, reasoning_kwargs = [], [], None
    for kwargs in THINKING_KWARGS if end else ():
        try:
            prompt = base.render([USER], None, kwargs, True)
        except Exception:  # a switch the template refuses
            continue
        opening = prompt[prompt.rfind(USER["content"]) + len(USER["content"]) :]
        rendered = tail(plain, kwargs)
        if rendered and CONTENT in rendered:
            before, _, after = rendered[: rendered.rfind(end)].partition(CONTENT)
            text_shapes.append((opening, before, after))
        for tools, reply in ((None, thought), ([PROBE_TOOL], Reply(REASONING, CONTENT, (PROBE_CALL,)))):
            rendered = tail(reply, kwargs, tools)
            if rendered and REASONING in rendered and CONTENT in rendered:
                before, _, rest = rendered[: rendered.rfind(end)].partition(REASONING)
                between, _, after = rest.partition(CONTENT)
                reasoning_shapes += [(opening, before, between, after)] if tools is None else []
                reasoning_kwargs = (kwargs, tools is not None) if reasoning_kwargs is None else reasoning_kwargs
    fmt = TemplateFormat(
        name="template",
        end_of_turn=end or "",
        tokenizer=tokenizer,
        end_markers=end_markers,
        stop_markers=end_markers[1:],
        reasoning_shapes=tuple(dict.fromkeys(reasoning_shapes)),
        text_shapes=tuple(dict.fromkeys(text_shapes)),
    )
    return replace(fmt, probes=feature_probes(fmt, text_tail, call_tail, reasoning_kwargs, second_tail))


def last_added(fmt: TemplateFormat, text: str | None) -> str | None:
    """The added token that occurs last in `text` (the longest where two end at the same place)."""
    found = [(text.rfind(t) + len(t), len(t), t) for t in fmt.added_tokens if text and t in text]
    return max(found)[2] if found else None


def end_of_turn(fmt: TemplateFormat, text_tail: str | None) -> str | None:
    """The token that ends a turn: the last added token after the content that also closes a turn before the next
    user turn (a template may write eos after the last turn only, as Phi-3.5's does)."""
    if not text_tail or CONTENT not in text_tail:
        return None
    after = text_tail[text_tail.find(CONTENT) + len(CONTENT) :]
    rendered = fmt.safe_render([USER, {"role": "assistant", "content": CONTENT}, USER_2], False)
    gap = rendered[rendered.find(CONTENT) + len(CONTENT) : rendered.find(USER_2["content"])]
    closing = [t for t in fmt.added_tokens if t in after and t in gap]
    return max(((after.rfind(t) + len(t), len(t), t) for t in closing), default=(0, 0, last_added(fmt, after)))[2]


def feature_probes(fmt: TemplateFormat, text_tail, call_tail, reasoning_kwargs, history) -> tuple[Probe, ...]:
    """Each feature of a turn, proven on the template: rendered in full after the generation prompt, and round-tripping."""
    from tasks.target_model.tokens import codec

    tokens = codec(fmt.tokenizer)
    eot = fmt.end_of_turn
    full = fmt.safe_render([USER, {"role": "assistant", "content": CONTENT}, USER_2], True)
    calls = call_tail is not None and "zq7_tool" in call_tail and VALUE in call_tail
    switch, beside_calls = reasoning_kwargs or ({}, False)
    how = (json.dumps(switch) if switch else "no switch") + (", only beside tool calls" if beside_calls else "")
    verdicts = [
        ("content", text_tail is not None, "rendered after the generation prompt", "not rendered after the generation prompt"),
        ("end of turn", bool(eot) and tokens.encode(eot) == [tokens.added.get(eot)],
         " / ".join(fmt.end_markers), f"no single token ends a turn ({eot!r})"),
        ("reasoning", reasoning_kwargs is not None, f"rendered ({how})", "the template drops a reply's reasoning"),
        ("tool calls", calls, "name and arguments rendered", "the template drops tool calls"),
        ("history", history is not None and CONTENT_2 in history,
         "earlier replies rendered, each prompt a prefix", "a second turn does not extend the first"),
        ("round trip", bool(full) and tokens.round_trips(tokens.encode(full), full),
         "encode then decode gives the text back", "the rendered text does not round-trip"),
    ]  # fmt: skip
    return tuple(Probe(feature, ok, yes if ok else no) for feature, ok, yes, no in verdicts)
