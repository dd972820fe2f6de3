"""The full-size model of ``taobao-style``: every user, item and category occurs over the full dataset.

At the real table sizes (``max_rows_per_table: null``) a user, item or
category exists because it occurs in the behaviour log. The full dataset is a
stream of ``C = full_samples`` clicks in time order (the real log's
behaviours); each user's first click only serves as history, every later
click is a sample (a positive, then a negative with the same user and
history), so every click is in the dataset, as a target or in the history of
its user's next click, and the full dataset has ``2 (C - users)`` samples
(``GeneratorConfig.full_rows``). A dataset of ``rows`` samples is the first
``ceil(rows / 2)`` sample clicks of that stream (an odd ``rows`` drops the
last negative), computed without the rest:

- **Users** click exactly ``2 + extra`` times over the full stream, ``extra``
  split by lognormal(0, ``USER_SIGMA``) activity weights (``occurrences.exact_counts``);
  their clicks are placed in time by a keyed shuffle of the positions
  (``occurrences.Occurrences``), so every user has a first click and a
  sample.
- **Items**: a share ``EXPLORE`` of the clicks (the explorations, chosen by
  a second keyed shuffle) follow exact counts ``table_counts(items,
  explorations, exponent)``: every item at least once, plus the power-law
  head, placed in time the same way; the others follow the user's interests
  as in the capped model (``generators.taobao``): one of ``INTERESTS``
  favourite categories, kept per user and re-drawn with probability
  ``interest_drift``, and an item of it by popularity ``∝ rank^-exponent``.
  Both use one rank -> id permutation whose hot ranks drift at the
  ``drift_segments`` boundaries of the full stream (among the ranks explored
  ``DRIFT_MIN_PER_SEGMENT`` times per segment on average, so every item still
  occurs). Every category holds an item, so every category occurs.
- **Negatives** are drawn by popularity among the items other than the click
  (the popularity with the clicked item's mass removed: one uniform each).
- **Splits** by user, fixed by the full stream: users in a random order are
  held out until they hold ``holdout_fraction`` of the full stream's sample
  clicks, halved (by samples) into val then test. Rows are train, val, then
  test samples, each in time order, so a prefix's split is a prefix of the
  full dataset's same split.

Every random stream gives one uniform per click in time order, so the output
does not depend on the chunk size. Memory holds per-user state (click count,
the last ``max_length`` items, the favourite categories), the item tables
and one chunk: independent of ``rows``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from hotcold.config import ConfigError
from hotcold.data.columns import release_pages
from hotcold.data.format import DatasetWriter
from hotcold.data.generators.config import GeneratorConfig
from hotcold.data.generators.criteo import STATS_SAMPLES, _chunks
from hotcold.data.generators.drift import HOT_FRACTION
from hotcold.data.generators.occurrences import (DRIFT_MIN_PER_SEGMENT, Occurrences, exact_counts,
                                                 miss_probability, table_counts)
from hotcold.data.generators.taobao import (CATEGORY_EXPONENT, EXPLORE, INTERESTS, USER_SIGMA, _assign_categories,
                                            _Popularity, _split_users)
from hotcold.data.powerlaw import powerlaw_weights
from hotcold.data.skew import add_counts, coverage_from_counts, tail_stats
from hotcold.metrics import roc_auc

CHUNK_CLICKS = 1 << 17
RELEASE_ROWS = 1 << 20   # rows between releases of the columns' mapped pages (``format.release_pages``)
SPLITS = ("train", "val", "test")


class _Model:
    """The full stream's fixed parts: catalogue, users' and explorations' occurrences, user splits."""

    def __init__(self, cfg: GeneratorConfig) -> None:
        n_users, n_items, n_cats = cfg.cardinalities
        clicks = cfg.full_samples
        (r_cat, r_item, r_user, *self.click_rngs) = (
            np.random.default_rng(s) for s in np.random.SeedSequence(cfg.seed).spawn(8))
        self.cfg, self.clicks = cfg, clicks
        self.cat_of_item = _assign_categories(n_items, n_cats, r_cat).astype(np.int32)       # [I]
        self.by_cat = np.argsort(self.cat_of_item, kind="stable")                          # [I]
        self.cat_bounds = np.searchsorted(self.cat_of_item[self.by_cat], np.arange(n_cats + 1))  # [C+1]
        self.where = np.empty(n_items, dtype=np.int64)                                     # item -> index in by_cat
        self.where[self.by_cat] = np.arange(n_items)
        self.rank_w = powerlaw_weights(n_items, cfg.exponent)
        self.explorations = min(clicks, max(n_items, round(EXPLORE * clicks)))
        self.items = Occurrences(table_counts(n_items, self.explorations, cfg.exponent), clicks,
                                 cfg.drift, cfg.drift_segments, r_item)
        self.first_perm = self.items.perm.copy()                                           # rank -> id at time 0
        activity = np.sort(r_user.lognormal(0.0, USER_SIGMA, n_users))[::-1]
        self.users = Occurrences(exact_counts(activity, clicks, minimum=2), clicks, 0.0, 1, r_user)
        user_clicks = np.empty(n_users, dtype=np.int64)
        user_clicks[self.users.perm] = self.users.counts                                   # [U] by id
        self.user_clicks = user_clicks
        self.user_split = _split_users(r_user.random(n_users), user_clicks - 1, cfg.holdout_fraction)  # [U]
        self.popularity: _Popularity | None = None
        self.pop_segment = -1

    def popularity_now(self) -> _Popularity:
        """Item popularity under the current (drifted) rank -> id permutation."""
        if self.pop_segment != self.items.segment:
            self.popularity = _Popularity(self.rank_w, self.items.perm, self.by_cat, self.cat_bounds)
            self.pop_segment = self.items.segment
        return self.popularity


def _within(sorted_keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For keys sorted in groups: index within the group [m], group starts [g], group sizes [g]."""
    m = sorted_keys.size
    starts = np.flatnonzero(np.concatenate([[True], sorted_keys[1:] != sorted_keys[:-1]])) if m else \
        np.zeros(0, dtype=np.int64)
    sizes = np.diff(np.append(starts, m))
    return np.arange(m) - np.repeat(starts, sizes), starts, sizes


def _plan(model: _Model, rows: int, chunk: int) -> dict[str, Any]:
    """Where the dataset of ``rows`` samples ends in the click stream, and each split's rows and history rows."""
    n_pos, L = (rows + 1) // 2, model.cfg.max_length
    seen = np.zeros(model.user_clicks.size, dtype=np.int64)
    clicks_of = np.zeros(3, dtype=np.int64)
    hist_of = np.zeros(3, dtype=np.int64)
    done, lo, last_hist = 0, 0, 0
    while done < n_pos:
        hi = min(lo + chunk, model.clicks)
        u = model.users.ids(lo, hi)
        order = np.argsort(u, kind="stable")
        j, _, _ = _within(u[order])
        k = np.empty(u.size, dtype=np.int64)
        k[order] = seen[u[order]] + j
        sample = np.flatnonzero(k >= 1)[:n_pos - done]
        if done + sample.size == n_pos:              # the stream ends at the n_pos-th sample click
            hi = lo + int(sample[-1]) + 1
            u = u[:hi - lo]
        split = model.user_split[u[sample]]
        h = np.minimum(k[sample], L)
        clicks_of += np.bincount(split, minlength=3)
        hist_of += np.bincount(split, weights=h, minlength=3).astype(np.int64)
        seen += np.bincount(u, minlength=seen.size)
        test = np.flatnonzero(split == 2)
        if test.size:
            last_hist = int(h[test[-1]])
        done += sample.size
        lo = hi
    odd = rows % 2
    n_rows = 2 * clicks_of - np.array([0, 0, odd])
    n_hist = 2 * hist_of - np.array([0, 0, odd * last_hist])
    if (n_rows < 1).any():
        raise ConfigError(f"generator config: rows={rows} leaves a split without samples (train/val/test rows "
                          f"{n_rows.tolist()}); make rows larger")
    return {"end": lo, "rows": n_rows, "hist": n_hist, "sample_clicks": n_pos}


def generate_taobao_fullsize(cfg: GeneratorConfig, out: Path, progress: bool = True,
                             chunk_clicks: int = CHUNK_CLICKS) -> dict[str, Any]:
    """Write the first ``cfg.rows`` samples of the full-size Taobao-style stream to ``out``; return the manifest."""
    n_rows, L = cfg.rows, cfg.max_length
    n_users, n_items, n_cats = cards = cfg.cardinalities
    model = _Model(cfg)
    plan = _plan(model, n_rows, chunk_clicks)
    end = plan["end"]
    row_start = np.concatenate([[0], np.cumsum(plan["rows"])])
    hist_start = np.concatenate([[0], np.cumsum(plan["hist"])])
    n_hist = int(hist_start[-1])
    splits = {name: (int(row_start[i]), int(row_start[i + 1])) for i, name in enumerate(SPLITS)}
    test_lo, test_hi = splits["test"]
    stride = max(1, -(-n_rows // STATS_SAMPLES))     # test AUC on every stride-th (positive, negative) pair

    seen = np.zeros(n_users, dtype=np.int64)                      # clicks so far per user
    recent = np.zeros((n_users, L), dtype=np.int32)               # the last L items per user (ring)
    slots = np.full(n_users * INTERESTS, -1, dtype=np.int32)      # favourite categories per (user, slot)
    r_slot, r_change, r_draw, r_pick, r_neg = model.click_rngs
    counts = [np.zeros(n, dtype=np.int64) for n in cards]
    row_at = row_start[:3].copy()
    hist_at = hist_start[:3].copy()
    positives = matched_pos = matched_neg = negatives = explored = 0
    auc_labels, auc_scores = [], []
    boundaries = [min(end, b) for b in model.items.boundaries]
    with DatasetWriter(out) as w, \
            tqdm(total=n_rows, unit="rows", desc=f"generate {cfg.name}", disable=not progress) as bar:
        w.column("dense", np.float32, (n_rows, 0))
        sparse = w.column("sparse", np.int32, (n_rows, 3))
        labels = w.column("labels", np.float32, (n_rows,))
        offsets = w.column("history_offsets", np.int64, (n_rows + 1,))
        history = w.column("history", np.int32, (n_hist, 2))
        columns = (sparse, labels, offsets, history)
        written = 0
        for _, lo, hi in _chunks(boundaries, chunk_clicks):
            m = hi - lo
            u = model.users.ids(lo, hi).astype(np.int64)             # [m] users in time order
            item = model.items.ids(lo, hi).astype(np.int64)          # [m] explorations' items, -1 elsewhere
            pop = model.popularity_now()
            s_slot, s_change, s_draw, s_pick, s_neg = (r.random(m) for r in (r_slot, r_change, r_draw, r_pick, r_neg))
            explored += int((item >= 0).sum())

            # Interest clicks: the category of the (user, slot), drawn at its first click and on drift.
            idx = np.flatnonzero(item < 0)
            key = u[idx] * INTERESTS + np.minimum((s_slot[idx] * INTERESTS).astype(np.int64), INTERESTS - 1)
            ko = np.argsort(key, kind="stable")
            idx, key = idx[ko], key[ko]
            _, kstart, ksize = _within(key)
            first = np.zeros(idx.size, dtype=bool)
            first[kstart] = True
            state = slots[key]
            draw = (s_change[idx] < cfg.interest_drift) | (first & (state < 0))
            value = state.astype(np.int64)
            value[draw] = pop.categories(s_draw[idx[draw]])
            src = np.maximum.accumulate(np.where(draw | first, np.arange(idx.size), 0))
            cat = value[src]
            if idx.size:
                last = kstart + ksize - 1
                slots[key[last]] = cat[last]
            item[idx] = pop.items(s_pick[idx], cat)

            # Histories: each user's previous L clicks, from this chunk or the ring of earlier ones.
            order = np.argsort(u, kind="stable")
            us = u[order]
            j, ustart, usize = _within(us)
            k_s = seen[us] + j
            item_s = item[order]
            hist_s = np.full((m, L), -1, dtype=np.int64)               # most recent last
            for d in range(1, L + 1):
                here = j >= d
                ring = ~here & (k_s >= d)
                hist_s[here, L - d] = item_s[np.flatnonzero(here) - d]
                hist_s[ring, L - d] = recent[us[ring], (k_s[ring] - d) % L]
            keep = j >= np.repeat(usize, usize) - L                    # each user's last L clicks of the chunk
            recent[us[keep], k_s[keep] % L] = item_s[keep]
            seen[us[ustart]] += usize
            hist = np.empty_like(hist_s)
            hist[order] = hist_s
            k = np.empty(m, dtype=np.int64)
            k[order] = k_s

            # Samples: every click after the user's first; the negative by popularity, never the click.
            sample = np.flatnonzero(k >= 1)
            tgt, hs, hl = item[sample], hist[sample], np.minimum(k[sample], L)
            pos = model.where[tgt]
            cum = pop.cum
            below = np.where(pos > 0, cum[np.maximum(pos - 1, 0)], 0.0)
            mass = cum[pos] - below
            x = s_neg[sample] * (cum[-1] - mass)
            x = np.where(x >= below, x + mass, x)
            npos = np.minimum(np.searchsorted(cum, x, side="right"), n_items - 1)
            npos = np.where(npos == pos, np.where(pos + 1 < n_items, pos + 1, pos - 1), npos)
            neg = model.by_cat[npos]
            valid = hs >= 0
            hcat = np.where(valid, model.cat_of_item[np.maximum(hs, 0)], -1)
            mpos = ((hcat == model.cat_of_item[tgt][:, None]) & valid).sum(1)
            mneg = ((hcat == model.cat_of_item[neg][:, None]) & valid).sum(1)
            split = model.user_split[u[sample]]
            for s in range(3):
                sel = np.flatnonzero(split == s)
                n = min(2 * sel.size, int(row_start[s + 1] - row_at[s]))
                if n == 0:
                    continue
                tg = np.stack([tgt[sel], neg[sel]], axis=1).ravel()[:n]
                lab = np.tile(np.array([1, 0], dtype=np.float32), sel.size)[:n]
                lens = np.repeat(hl[sel], 2)[:n]
                hrows = np.repeat(hs[sel], 2, axis=0)[:n]
                flat = hrows[np.arange(L)[None, :] >= L - lens[:, None]]  # oldest first, row by row
                r0, h0 = int(row_at[s]), int(hist_at[s])
                sparse[r0:r0 + n] = np.stack([u[sample][sel].repeat(2)[:n], tg, model.cat_of_item[tg]], axis=1)
                labels[r0:r0 + n] = lab
                offsets[r0:r0 + n] = h0 + np.concatenate([[0], np.cumsum(lens)[:-1]])
                history[h0:h0 + flat.size] = np.stack([flat, model.cat_of_item[flat]], axis=1)
                row_at[s] += n
                hist_at[s] += flat.size
                add_counts(counts[0], u[sample][sel].repeat(2)[:n])
                add_counts(counts[1], tg)
                add_counts(counts[1], flat)
                add_counts(counts[2], model.cat_of_item[tg])
                add_counts(counts[2], model.cat_of_item[flat])
                share = np.stack([mpos[sel], mneg[sel]], axis=1).ravel()[:n] / np.maximum(lens, 1)
                positives += int(lab.sum())
                negatives += int(n - lab.sum())
                matched_pos += int((mpos[sel] > 0).sum())
                matched_neg += int((mneg[sel] > 0)[: n - sel.size].sum())
                if s == 2:
                    pair = np.arange(r0, r0 + n) // 2                     # whole (positive, negative) pairs
                    keep_t = np.flatnonzero(pair % stride == 0)
                    auc_labels.append(lab[keep_t])
                    auc_scores.append(share[keep_t])
                if (written + n) // RELEASE_ROWS != written // RELEASE_ROWS:
                    for col in columns:
                        release_pages(col)
                written += n
                bar.update(n)
        offsets[n_rows] = n_hist
        if not (row_at == row_start[1:]).all() or not (hist_at == hist_start[1:]).all():
            raise AssertionError(f"taobao full-size: wrote rows {row_at.tolist()} / {row_start[1:].tolist()}, "
                                 f"history {hist_at.tolist()} / {hist_start[1:].tolist()}")
        for col in columns:
            release_pages(col)

        y, score = np.concatenate(auc_labels), np.concatenate(auc_scores)
        label_model = {
            "form": "label 1: target = the user's click; label 0: the same user and history, "
                    "target = a popular item other than the click",
            "positive_rate": positives / n_rows,
            "category_match_rate_positive": matched_pos / max(positives, 1),
            "category_match_rate_negative": matched_neg / max(negatives, 1),
            "category_match_auc_test": roc_auc(y, score),
            **({"statistics_sample_stride": stride} if stride > 1 else {}),
        }
        generator = {**cfg.to_dict(), "full_cardinalities": cfg.full_cardinalities, "hot_fraction": HOT_FRACTION,
                     "category_exponent": CATEGORY_EXPONENT, "user_sigma": USER_SIGMA, "interests": INTERESTS,
                     "explore": EXPLORE, "active_users": int((seen >= 2).sum()), "clicks": int(end),
                     "split_users": {name: int((model.user_split[seen >= 2] == i).sum())
                                     for i, name in enumerate(SPLITS)},
                     "history_length_mean": n_hist / n_rows,
                     "full_size_model": _summary(model, end, plan["sample_clicks"], explored)}
        meta = {"name": cfg.name, "kind": cfg.kind, "generator": generator, "label_model": label_model,
                "skew": coverage_from_counts(counts), "tail": tail_stats(counts)}
        return w.commit(cardinalities=cards, splits=splits, meta=meta,
                        sequence={"tables": [1, 2], "max_length": L})


def _summary(model: _Model, end: int, sample_clicks: int, explored: int) -> dict[str, Any]:
    """What the model promises: every row over the full stream; the share of each table a prefix touches."""
    return {
        "doc": "full_samples clicks (behaviours); every user clicks >= 2 times, every item is explored >= 1 "
               "time (generators.taobao_fullsize); this dataset is the first `rows` samples",
        "full_samples": model.clicks,
        "full_rows": model.cfg.full_rows,
        "explorations_full": model.explorations,
        "drift_min_per_segment": DRIFT_MIN_PER_SEGMENT,
        "items_explored_over_10_full": int((model.items.counts > 10).sum()),
        "touched_expected": [round(v, 6) for v in expected_touched(model, end, sample_clicks, explored)],
    }


def expected_touched(model: _Model, end: int, sample_clicks: int, explored: int) -> list[float]:
    """Predicted share of users, items and categories in the dataset of the first ``end`` clicks.

    A user is in it with its second click (hypergeometric over its exact
    count). An item is missed if its explorations all fall outside the
    dataset's (hypergeometric) and none of the other lookups of an item by
    popularity (interest clicks, negatives) picks it (Poisson); a user's lone
    first click is not in the dataset. A category is missed if all its items are.
    """
    clicks = model.clicks
    p0 = miss_probability(model.users.counts, end, clicks)
    p01 = miss_probability(model.users.counts, end, clicks, at_least=2)
    lone = float((p01 - p0).sum())                               # users whose only click is a first one
    kept = 1.0 - lone / max(end, 1)                              # share of the clicks in the dataset
    by_popularity = (end - explored) * kept + sample_clicks      # interest clicks and negatives
    p_rank = model.rank_w / model.rank_w.sum()
    miss_rank = (miss_probability(model.items.counts, min(round(explored * kept), model.explorations),
                                  model.explorations) * np.exp(-by_popularity * p_rank))
    miss_item = np.empty_like(miss_rank)
    miss_item[model.first_perm] = miss_rank
    log_miss = np.bincount(model.cat_of_item, weights=np.log(np.maximum(miss_item, 1e-300)),
                           minlength=model.cat_bounds.size - 1)
    return [1.0 - float(p01.mean()), 1.0 - float(miss_rank.mean()), 1.0 - float(np.exp(log_miss).mean())]
