"""The in-process scorer of `guided`: the target in transformers, its KV cache kept between rounds, edits scored
as token trees through 4D attention masks (tasks/reconstruct/guided.py runs the search)."""

from __future__ import annotations

import math
import os

import numpy as np
import torch

from tasks.config import GuidedConfig


class Pass:
    """One forward pass over rows, `batch_rows` at a time (right-padded): every row's KV cache and the decoder's
    states where next-token log-probabilities will be asked for."""

    def __init__(self, model, rows: list[list[int]], firsts: list[int], batch_rows: int, previous=None, shared=True):
        """`firsts`: per row, the earliest position whose next-token distribution is needed (the lm_head runs
        on those positions only, and only where asked: see `normalize`).

        `previous`: (an earlier pass, each row's index in it) where each row's tokens before its `first` are
        as they were then: those positions are taken from that pass's cache, not run again.

        `shared`: the leading tokens all rows of a batch have in common (a system prompt, tool definitions) are run
        once, for every batch that shares them, and their cache given to each row.
        """
        from transformers import DynamicCache

        self.head = model.get_output_embeddings()
        self.caches, self.lanes, states = [], [], []  # per batch its cache; per row (batch, lane)
        self.at = np.zeros(len(rows), dtype=int)  # row i's position u is at states[at[i] + u]
        common: dict[tuple[int, ...], list] = {}  # leading ids -> their cache (batch of one)
        for lo in range(0, len(rows), batch_rows):
            batch = range(lo, min(lo + batch_rows, len(rows)))
            width = max(len(rows[i]) for i in batch)
            if previous:
                skip = min(firsts[i] for i in batch)
                prefix = previous[0].kv([previous[1][i] for i in batch], skip)
            else:
                common_ids = os.path.commonprefix([rows[i] for i in batch]) if shared and len(batch) > 1 else []
                skip = min(len(common_ids), *(firsts[i] for i in batch))
                prefix = common_cache(model, tuple(rows[lo][:skip]), len(batch), common) if skip else None
            ids = torch.zeros((len(batch), width - skip), dtype=torch.long)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            for lane, i in enumerate(batch):
                ids[lane, : len(rows[i]) - skip] = torch.tensor(rows[i][skip:])
                mask[lane, : len(rows[i])] = 1
            cache = DynamicCache(ddp_cache_data=prefix) if prefix else None
            out = model.get_decoder()(input_ids=ids, attention_mask=mask, cache=cache, use_cache=True)
            self.caches.append([(layer.keys, layer.values) for layer in out.cache.layers])
            for lane, i in enumerate(batch):
                self.lanes.append((len(self.caches) - 1, lane))
                self.at[i] = sum(len(x) for x in states) - firsts[i]
                states.append(out.last_hidden_state[lane, firsts[i] - skip : len(rows[i]) - 1 - skip])
        self.states = torch.cat(states)
        self.norm = torch.full((len(self.states),), math.nan)  # log-normalizers, projected where asked for

    def kv(self, rows: list[int], width: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, the cached keys and values of positions [0, width) of these rows, stacked (copies; zeros
        past a row's batch width, which a mask must hide)."""
        out = []
        for layer in range(len(self.caches[0])):
            pairs = []
            for row in rows:
                batch, lane = self.lanes[row]
                keys, values = (x[lane : lane + 1, :, :width] for x in self.caches[batch][layer])
                pad = (0, 0, 0, width - keys.shape[2])
                pairs.append((torch.nn.functional.pad(keys, pad), torch.nn.functional.pad(values, pad)))
            out.append((torch.cat([k for k, _ in pairs]), torch.cat([v for _, v in pairs])))
        return out

    def raw(self, row: int, position, tokens) -> torch.Tensor:
        """Unnormalized logits of `tokens` after ids[:position + 1] of one row (their differences are those of
        log-probabilities): one dot product each, not a projection onto the whole vocabulary."""
        state = self.states[int(self.at[row]) + position].float()
        out = (state * self.head.weight[tokens].float()).sum(-1)
        return out if self.head.bias is None else out + self.head.bias[tokens].float()

    def normalize(self, row: int, positions) -> None:
        """Project the states of these positions of one row onto the vocabulary (once) for their normalizers."""
        at = torch.tensor(sorted(positions), dtype=torch.long) + int(self.at[row])
        at = at[self.norm[at].isnan()]
        if len(at):
            self.norm[at] = torch.logsumexp(self.head(self.states[at]).float(), dim=-1)

    def logprob(self, row: int, position, tokens) -> torch.Tensor:
        """log p(tokens | ids[:position + 1]) of one row, at positions already normalized."""
        return self.raw(row, position, tokens) - self.norm[int(self.at[row]) + position]


def common_cache(model, ids: tuple[int, ...], lanes: int, cache: dict) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer, the keys and values of these leading ids for `lanes` rows (run once per distinct prefix)."""
    if ids not in cache:
        out = model.get_decoder()(input_ids=torch.tensor([ids]), use_cache=True)
        cache[ids] = [(layer.keys, layer.values) for layer in out.cache.layers]
    return [(k.expand(lanes, -1, -1, -1), v.expand(lanes, -1, -1, -1)) for k, v in cache[ids]]


class Tree:
    """One row's edits as a token tree to score in one forward: edits that begin alike share their nodes."""

    def __init__(self, row: int):
        self.row = row
        self.tokens: list[int] = []
        self.positions: list[int] = []
        self.sees: list[list[int]] = []  # per node: the nodes it attends to (its ancestors and itself)
        self.before: list[int] = []  # per node: the cache positions it attends to, [0, before)
        self.paths: list[tuple[int, list[int], list[int]]] = []  # per edit: (index, its nodes, the tokens they predict)
        self.index: dict[tuple, int] = {}

    def add(self, i: int, edit, ids: list[int], window: int) -> None:
        scored = list(edit.tokens) + ids[edit.stop : edit.stop + window]
        parent, nodes = None, []
        for j, token in enumerate(scored[:-1]):  # the last scored token is read off the node before it
            key = (edit.start, parent, token)
            if key not in self.index:
                self.index[key] = len(self.tokens)
                self.tokens.append(token)
                self.positions.append(edit.start + j)
                self.sees.append([*(self.sees[parent] if parent is not None else []), self.index[key]])
                self.before.append(edit.start)
            parent = self.index[key]
            nodes.append(parent)
        self.paths.append((i, nodes, scored[1:]))


def edit_trees(spans: list, edits: list, cfg: GuidedConfig) -> list[Tree]:
    """Each row's edits, in order, as trees of about `tree_tokens` nodes."""
    trees: dict[int, list[Tree]] = {}
    for i in sorted(range(len(edits)), key=lambda i: edits[i].start):
        edit = edits[i]
        mine = trees.setdefault(edit.row, [Tree(edit.row)])
        if len(mine[-1].tokens) >= cfg.tree_tokens:
            mine.append(Tree(edit.row))
        mine[-1].add(i, edit, spans[edit.row].ids, cfg.window)
    return [tree for mine in trees.values() for tree in mine if tree.tokens]


def score_edits(model, spans: list, base: Pass, edits: list, cfg: GuidedConfig) -> list[float]:
    """Log-likelihood gain of each edit: its tokens and the window after it, over the same span as it stands.

    Each row's edits, a block at a time, form a token tree whose nodes attend to the cache before their
    edit and to their own ancestors (a 4D mask), so edits that begin alike share their tokens. Trees of
    similar size share a forward over their rows' cached keys and values.
    """
    from transformers import DynamicCache

    gains = [edit.first - edit.base for edit in edits]  # an edit of one token with no window left: its first
    trees = sorted(edit_trees(spans, edits, cfg), key=lambda tree: len(tree.tokens))
    for lo, hi in pack_calls([len(tree.tokens) for tree in trees], cfg.batch_rows * cfg.tree_tokens):
        call = trees[lo:hi]
        n = len(call[-1].tokens)
        width = max(max(tree.before) for tree in call)  # no node reads the cache past its edit
        ids = torch.zeros((len(call), n), dtype=torch.long)
        positions = torch.zeros((len(call), n), dtype=torch.long)
        mask = torch.zeros((len(call), 1, n, width + n), dtype=torch.bool)
        mask[:, 0, :, 0] = True  # padding nodes see one key (a row of the mask with none gives NaN)
        for b, tree in enumerate(call):
            ids[b, : len(tree.tokens)] = torch.tensor(tree.tokens, dtype=torch.long)
            positions[b, : len(tree.tokens)] = torch.tensor(tree.positions, dtype=torch.long)
            for q, (before, sees) in enumerate(zip(tree.before, tree.sees, strict=True)):
                mask[b, 0, q, :before] = True
                mask[b, 0, q, [width + k for k in sees]] = True
        cache = DynamicCache(ddp_cache_data=base.kv([tree.row for tree in call], width))
        out = model.get_decoder()(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True)
        real = torch.cat([torch.arange(len(tree.tokens)) + b * n for b, tree in enumerate(call)])  # not the padding
        states = out.last_hidden_state.reshape(len(call) * n, -1)[real]
        logprobs = base.head(states).float().log_softmax(dim=-1)  # (real nodes, V)
        at = 0
        for tree in call:
            for i, nodes, targets in tree.paths:
                gains[i] += float(logprobs[[at + q for q in nodes], targets].sum())
            at += len(tree.tokens)
    return gains


CALL_TOKENS = 16  # a forward's fixed cost (reading the weights, launching it) in tokens' worth of compute


def pack_calls(sizes: list[int], budget: int) -> list[tuple[int, int]]:
    """Split ascending tree sizes into consecutive forwards, each padded to its largest tree, at the least
    padded tokens plus `CALL_TOKENS` per forward (a forward holds at most `budget` tokens, or one tree)."""
    cost, cut = [0] + [math.inf] * len(sizes), [0] * (len(sizes) + 1)
    for hi in range(1, len(sizes) + 1):
        for lo in range(hi - 1, -1, -1):
            if hi - lo > 1 and (hi - lo) * sizes[hi - 1] > budget:
                break
            here = cost[lo] + (hi - lo) * sizes[hi - 1] + CALL_TOKENS
            if here < cost[hi]:
                cost[hi], cut[hi] = here, lo
    calls, hi = [], len(sizes)
    while hi:
        calls.append((cut[hi], hi))
        hi = cut[hi]
    return calls[::-1]
