"""Taobao-style click sequences: the ``taobao-style`` kind.

The layout is that of TBSM's Taobao UserBehavior preprocessing: a sample is
(user, target item, target category) in ``sparse`` [N, 3], no dense features
(``dense`` [N, 0]), and the (item, category) pairs of the user's previous
clicks, oldest first, as a history of at most ``max_length`` events
(``sequence = {"tables": [1, 2], "max_length": L}``). Half the samples
are negatives whose target is another item, as in TBSM.

The model behind the clicks: ``generate_taobao`` (tables capped,
``max_rows_per_table`` set); at the real table sizes every user, item and
category occurs over a full click stream: ``generators.taobao_fullsize``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from hotcold.config import ConfigError
from hotcold.data.format import write_dataset
from hotcold.data.generators.config import GeneratorConfig
from hotcold.data.generators.drift import HOT_FRACTION, drift
from hotcold.data.powerlaw import draw_ranks, invert_cdf, powerlaw_cdf, powerlaw_weights
from hotcold.data.skew import coverage_from_counts
from hotcold.metrics import roc_auc

CATEGORY_EXPONENT = 1.0  # power law of category sizes (items per category)
USER_SIGMA = 1.0         # lognormal sigma of user activity
INTERESTS = 3            # favourite categories per user
EXPLORE = 0.2            # share of clicks that ignore the user's interests


class _Popularity:
    """Item popularity of one time segment, ready for draws by category or overall."""

    def __init__(self, rank_weights: np.ndarray, perm: np.ndarray, by_cat: np.ndarray,
                 cat_bounds: np.ndarray) -> None:
        w = np.empty(perm.size, dtype=np.float64)
        w[perm] = rank_weights                                   # [I] weight of each item id
        self.by_cat = by_cat                                     # [I] item ids sorted by category
        self.cum = np.cumsum(w[by_cat])                          # [I]
        ends = np.concatenate([[0.0], self.cum])[cat_bounds]     # [C+1] cumulative mass at boundaries
        self.cat_lo, self.cat_mass = ends[:-1], np.diff(ends)    # [C], [C]
        self.cat_first, self.cat_last = cat_bounds[:-1], cat_bounds[1:] - 1
        self.cat_cum = np.cumsum(self.cat_mass)                  # [C]

    def items(self, u: np.ndarray, cats: np.ndarray | None = None) -> np.ndarray:
        """Item ids for uniforms ``u`` in [0, 1): by popularity, within ``cats`` if given."""
        if cats is None:
            pos = invert_cdf(self.cum, u)
        else:
            pos = np.searchsorted(self.cum, self.cat_lo[cats] + u * self.cat_mass[cats], side="right")
            pos = np.clip(pos, self.cat_first[cats], self.cat_last[cats])
        return self.by_cat[pos]

    def categories(self, u: np.ndarray) -> np.ndarray:
        """Category ids for uniforms ``u`` in [0, 1), by category popularity."""
        return invert_cdf(self.cat_cum, u)


def _assign_categories(n_items: int, n_cats: int, rng: np.random.Generator) -> np.ndarray:
    """int64 [I] category of each item: one item per category first, the rest by power-law size."""
    cat_perm = rng.permutation(n_cats)                           # size rank -> category id
    first = min(n_items, n_cats)
    rest = draw_ranks(rng, n_items - first, powerlaw_cdf(n_cats, CATEGORY_EXPONENT))
    ranks = np.concatenate([np.arange(first), rest])
    return cat_perm[ranks][rng.permutation(n_items)]


def _interest_categories(key: np.ndarray, change: np.ndarray, segment: np.ndarray,
                         pops: list[_Popularity], rng: np.random.Generator) -> np.ndarray:
    """Category of each interest click, given clicks sorted by (user, slot) then time.

    ``key`` [M] identifies the (user, slot); a slot draws a category at its first
    click and wherever ``change`` [M] is set, and keeps it until the next draw.
    """
    m = key.size
    if m == 0:
        return np.zeros(0, dtype=np.int64)
    draw = change.copy()
    draw[0] = True
    draw[1:] |= key[1:] != key[:-1]
    drawn = np.zeros(m, dtype=np.int64)
    u = rng.random(m)
    for s, pop in enumerate(pops):
        sel = draw & (segment == s)
        drawn[sel] = pop.categories(u[sel])
    src = np.maximum.accumulate(np.where(draw, np.arange(m), 0))  # last draw at or before each click
    return drawn[src]


def _split_users(last: np.ndarray, samples: np.ndarray, fraction: float) -> np.ndarray:
    """Split of each active user (0 train, 1 val, 2 test) from its last click time ``last`` [A].

    The users with the latest last click are held out until they hold at least
    ``fraction`` of the samples (``samples`` [A]); in order of last click, the
    first half of their samples goes to val, the rest to test. Each split
    keeps at least one user.
    """
    n = last.size
    order = np.argsort(last, kind="stable")
    tail = np.cumsum(samples[order][::-1])                             # samples of the latest 1, 2, ... users
    hold = int(np.clip(np.searchsorted(tail, fraction * tail[-1]) + 1, 2, n - 1))
    held = order[n - hold:]
    cum = np.cumsum(samples[held])
    n_val = int(np.clip(np.searchsorted(cum, cum[-1] / 2) + 1, 1, hold - 1))
    split = np.zeros(n, dtype=np.int64)
    split[held[:n_val]] = 1
    split[held[n_val:]] = 2
    return split


def _negatives(clicked: np.ndarray, segment: np.ndarray, pops: list[_Popularity],
               rng: np.random.Generator) -> np.ndarray:
    """int64 [M] items drawn by the popularity of each click's segment, never the clicked item."""
    out = clicked.copy()
    todo = np.ones(clicked.size, dtype=bool)
    while todo.any():
        u = rng.random(clicked.size)
        for s, pop in enumerate(pops):
            sel = todo & (segment == s)
            out[sel] = pop.items(u[sel])
        todo &= out == clicked
    return out


def generate_taobao(cfg: GeneratorConfig, out: Path, progress: bool = True) -> dict[str, Any]:
    """Write a Taobao-style dataset for ``cfg`` to ``out``; return its manifest (``progress`` is unused).

    The model behind the clicks:

    - Items: popularity ``∝ rank^-exponent`` (``data.powerlaw``) with ranks mapped to scattered ids;
      the hot ranks drift between ``drift_segments`` time segments as in the
      Criteo kinds. Every item belongs to one category; category sizes (items)
      are ``∝ rank^-CATEGORY_EXPONENT``, every category has at least one item.
    - Users: activity weights are lognormal(0, USER_SIGMA); the ceil(rows / 2)
      sample clicks are spread over users by a multinomial. Each active user
      first makes a warm-up of 1..L clicks (uniform) that only serve as
      history, so histories are 1..L events long, mostly full.
      A user's clicks happen at uniform random times in [0, 1).
    - Clicks: with probability EXPLORE a click takes an item by global
      popularity; otherwise it follows one of the user's INTERESTS favourite
      categories (slot chosen uniformly) and takes an item of that category by
      popularity. A slot gets its category, drawn by category popularity (the
      summed popularity of its items), at its first click and again, with
      probability ``interest_drift``, at any later click: interests drift slowly.
    - Samples: every non-warm-up click gives a positive (label 1, the click as
      target) followed by a negative with the same user and history whose target
      is an item drawn by popularity (DIEN and TBSM sample negatives from the
      click log), never the clicked one, with its category: exactly 50%
      negatives, as the real preprocessor (``hotcold.data.sources.taobao``) gives with
      ``negative_ratio`` 1 (an odd ``rows`` drops the last negative). Positives
      thus mostly share their category with the history and negatives mostly
      do not; the manifest records the test AUC of
      that single feature as a reference (``label_model.category_match_auc_test``).
    - Splits by user, like TBSM and ``hotcold.data.sources.taobao``: the users with the
      latest last click are held out until they hold ``holdout_fraction`` of the
      samples, and halved (by samples, in order of last click) into val then
      test. Rows are train, val, then test samples, each in time order.
    """
    n_rows, L, S = cfg.rows, cfg.max_length, cfg.drift_segments
    cards = cfg.cardinalities
    n_users, n_items, n_cats = cards
    r_cat, r_item, r_user, r_click, r_interest, r_label = (
        np.random.default_rng(s) for s in np.random.SeedSequence(cfg.seed).spawn(6))

    # Catalogue and its popularity per time segment.
    cat_of_item = _assign_categories(n_items, n_cats, r_cat)             # [I]
    by_cat = np.argsort(cat_of_item, kind="stable")                      # [I]
    cat_bounds = np.searchsorted(cat_of_item[by_cat], np.arange(n_cats + 1))  # [C+1]
    rank_w = powerlaw_weights(n_items, cfg.exponent)
    perm = r_item.permutation(n_items)                                   # rank -> item id
    hot = max(1, int(np.ceil(HOT_FRACTION * n_items)))
    pops = []
    for s in range(S):
        if s > 0 and cfg.drift > 0:
            drift(perm, hot, cfg.drift, r_item)
        pops.append(_Popularity(rank_w, perm, by_cat, cat_bounds))

    # Users and their clicks, grouped by user in time order.
    n_pos = (n_rows + 1) // 2                                            # clicks that become samples
    activity = r_user.lognormal(0.0, USER_SIGMA, n_users)
    samples_of = r_user.multinomial(n_pos, activity / activity.sum())    # [U]
    active = np.flatnonzero(samples_of)                                  # [A]
    if active.size < 3:
        raise ConfigError(f"generator config: rows={n_rows} over {n_users} users leaves {active.size} active "
                          "user(s); train, val and test need one each")
    warm = r_user.integers(1, L + 1, active.size)                        # warm-up clicks per active user
    per_user = samples_of[active] + warm
    n_clicks = int(per_user.sum())
    user = np.repeat(active, per_user)                                   # [E]
    k = np.arange(n_clicks) - np.repeat(np.cumsum(per_user) - per_user, per_user)  # index within user
    time = r_click.random(n_clicks)
    time = time[np.lexsort((time, user))]                                # sorted within each user
    segment = np.minimum((time * S).astype(np.int64), S - 1)

    # Items of the clicks: explorations by global popularity, the rest by interest.
    explore = r_click.random(n_clicks) < EXPLORE
    slot = r_interest.integers(0, INTERESTS, n_clicks)
    change = r_interest.random(n_clicks) < cfg.interest_drift
    category = np.empty(n_clicks, dtype=np.int64)
    idx = np.flatnonzero(~explore)
    key = user[idx] * INTERESTS + slot[idx]
    order = np.argsort(key, kind="stable")                               # (user, slot), then time
    idx = idx[order]
    category[idx] = _interest_categories(key[order], change[idx], segment[idx], pops, r_interest)
    item = np.empty(n_clicks, dtype=np.int64)
    u = r_click.random(n_clicks)
    for s, pop in enumerate(pops):
        in_s = segment == s
        sel = in_s & ~explore
        item[sel] = pop.items(u[sel], category[sel])
        sel = in_s & explore
        item[sel] = pop.items(u[sel])
    category[explore] = cat_of_item[item[explore]]

    # Sample clicks ordered by split (held-out users by last click), then time; negatives by popularity.
    user_split = _split_users(time[np.cumsum(per_user) - 1], samples_of[active], cfg.holdout_fraction)  # [A]
    clicks = np.flatnonzero(k >= np.repeat(warm, per_user))              # [n_pos]
    click_split = np.repeat(user_split, per_user)[clicks]
    clicks = clicks[np.lexsort((time[clicks], click_split))]
    click_split = np.sort(click_split)
    negative = _negatives(item[clicks], segment[clicks], pops, r_label)  # [n_pos]

    # Rows: each sample click gives its positive, then a negative with the same user and history.
    row_click = np.repeat(clicks, 2)[:n_rows]                            # [N]
    labels = np.tile(np.array([1, 0], dtype=np.float32), n_pos)[:n_rows]
    target = np.stack([item[clicks], negative], axis=1).ravel()[:n_rows]
    sparse = np.stack([user[row_click], target, cat_of_item[target]], axis=1).astype(np.int32)  # [N, 3]
    hist_len = np.minimum(k[row_click], L)
    offsets = np.concatenate([[0], np.cumsum(hist_len)]).astype(np.int64)  # [N+1]
    within = np.arange(offsets[-1]) - np.repeat(offsets[:-1], hist_len)
    src = np.repeat(row_click - hist_len, hist_len) + within             # [H] clicks in the histories
    history = np.stack([item[src], category[src]], axis=1).astype(np.int32)  # [H, 2]
    n_train, n_val = 2 * int((click_split == 0).sum()), 2 * int((click_split == 1).sum())
    splits = {"train": (0, n_train), "val": (n_train, n_train + n_val), "test": (n_train + n_val, n_rows)}

    counts = [np.bincount(sparse[:, 0], minlength=n_users),
              np.bincount(sparse[:, 1], minlength=n_items) + np.bincount(history[:, 0], minlength=n_items),
              np.bincount(sparse[:, 2], minlength=n_cats) + np.bincount(history[:, 1], minlength=n_cats)]
    test = slice(*splits["test"])
    sample_of_hist = np.repeat(np.arange(n_rows), hist_len)
    matches = np.bincount(sample_of_hist, weights=history[:, 1] == sparse[sample_of_hist, 2], minlength=n_rows)
    match_share = matches / np.maximum(hist_len, 1)                      # [N] history share in the target category
    label_model = {
        "form": "label 1: target = the user's click; label 0: the same user and history, "
                "target = a popular item other than the click",
        "positive_rate": float(labels.mean()),
        "category_match_rate_positive": float((matches[labels == 1] > 0).mean()),
        "category_match_rate_negative": float((matches[labels == 0] > 0).mean()),
        "category_match_auc_test": roc_auc(labels[test], match_share[test]),
    }
    generator = {**cfg.to_dict(), "full_cardinalities": cfg.full_cardinalities, "hot_fraction": HOT_FRACTION,
                 "category_exponent": CATEGORY_EXPONENT, "user_sigma": USER_SIGMA, "interests": INTERESTS,
                 "explore": EXPLORE, "active_users": int(active.size), "clicks": n_clicks,
                 "split_users": {name: int((user_split == i).sum()) for i, name in enumerate(("train", "val", "test"))},
                 "history_length_mean": float(hist_len.mean())}
    meta = {"name": cfg.name, "kind": cfg.kind, "generator": generator, "label_model": label_model,
            "skew": coverage_from_counts(counts)}
    return write_dataset(out, dense=np.zeros((n_rows, 0), dtype=np.float32), sparse=sparse, labels=labels,
                         cardinalities=cards, splits=splits, meta=meta, history=history,
                         history_offsets=offsets, sequence={"tables": [1, 2], "max_length": L})
