"""MovieLens-100k for the DEQL recommenders: found or fetched, read, binarised, split.

    X = load_ml100k()                                # Interactions: csr [users, items], ids
    strong = strong_split(X.matrix, n_val=100, n_test=100, seed=0)
    fold = fold_split(X.matrix, fold=0, folds=5, n_val=150, seed=0)  # StrongSplit, 5-fold CV
    weak = weak_split(X.matrix, seed=0)

The file: the recbole wheel on PyPI ships `recbole/dataset_example/ml-100k/ml-100k.inter`
(1.9 MB inside a 2.1 MB wheel, recbole==1.2.1). `ml100k_path` looks in a folder ($DEQL_DATA,
else ~/.cache/iclr26/recbole-ml100k) for `ml-100k.inter` or GroupLens's own `u.data`, and
otherwise `pip download`s the wheel without dependencies (recbole would pull in torch) and
extracts that one file. Offline, put either file in a folder and set DEQL_DATA to it.

Formats (`read_interactions` tells them apart by the first line):
- recbole atomic file: a header of `name:type` columns, e.g. `user_id:token  item_id:token
  rating:float  timestamp:float`, then one tab-separated row per rating;
- GroupLens `u.data`: `user  item  rating  timestamp`, tab-separated, no header.

Matrices are scipy CSR (float32 ones): memory follows the interactions, not users x items, so
the same code holds ML-20M (138k x 20k would be 11 GB dense); row slicing is what the user
splits need, and `.toarray()` gives the dense blocks that the solvers and metrics take.

Splits (both seeded, both keep only the items that occur in their train matrix, because an item
without train interactions has an all-zero Gram row and column: no model can score it and the
unregularised solves become singular; the interactions lost that way are counted in the split's
`dropped`, never silently):
- strong generalisation (Liang et al. 2018): `n_val` and `n_test` held-out users; each of their
  interaction sets is split into fold-in (80 %) and held-out (20 %, at least one item); the
  remaining users form the train matrix. Only users with >= 2 interactions are held out.
  `strong_split` draws both sets afresh per seed (two seeds' test users overlap);
  `fold_split` is K-fold cross-validation over users: fold f's test users are the f-th of K
  parts of one seeded permutation (every eligible user is a test user exactly once over the K
  folds; `require_tested_once` checks it), its validation users a seeded draw from the others.
- weak generalisation: every user's interactions split into train / val / test (70/10/20 by
  default, rounded per user; the remainder goes to train).
Every error is a `DataError` of one line.
"""

import os
import sys
from pathlib import Path
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp

from core import wheels
from core.errors import ConfigError

PACKAGE_SPEC = "recbole==1.2.1"  # checked: its wheel holds the file below (1,979,230 bytes)
WHEEL_MEMBER = "recbole/dataset_example/ml-100k/ml-100k.inter"
INTER_NAME = "ml-100k.inter"
GROUPLENS_NAME = "u.data"
DEFAULT_CACHE = Path("~/.cache/iclr26/recbole-ml100k")
RECBOLE_COLUMNS = ("user_id", "item_id", "rating")  # the columns we read from a .inter header


class DataError(ConfigError):
    """The ratings file cannot be found, fetched or read; one line that says what to do."""


class Interactions(NamedTuple):
    matrix: sp.csr_matrix  # [users, items] float32 ones where rating >= threshold
    user_ids: np.ndarray  # [users] original user tokens (str), row order
    item_ids: np.ndarray  # [items] original item tokens (str), column order


class StrongSplit(NamedTuple):
    train: sp.csr_matrix  # [train users, items]
    val_in: sp.csr_matrix  # [val users, items] fold-in (80 %)
    val_out: sp.csr_matrix  # [val users, items] held-out (20 %)
    test_in: sp.csr_matrix
    test_out: sp.csr_matrix
    items: np.ndarray  # [items] column index into the matrix that was split
    dropped: int  # held-out users' interactions on items no train user has (not scorable)
    val_users: np.ndarray  # [val users] row index into the matrix that was split, sorted
    test_users: np.ndarray  # [test users] likewise: the rows of test_in / test_out


class WeakSplit(NamedTuple):
    train: sp.csr_matrix  # [users, items]; val and test have the same users and items
    val: sp.csr_matrix
    test: sp.csr_matrix
    items: np.ndarray  # [items] column index into the matrix that was split
    dropped: int  # val/test interactions on items without a train interaction (not scorable)


# ---------------------------------------------------------------------------------------------
# Finding the file


def ml100k_path(folder: str | os.PathLike | None = None) -> Path:
    """The ratings file: `ml-100k.inter` or `u.data` in `folder` (else $DEQL_DATA, else
    ~/.cache/iclr26/recbole-ml100k), fetched from the recbole wheel when neither is there."""
    folder = Path(folder or os.environ.get("DEQL_DATA") or DEFAULT_CACHE).expanduser()
    for name in (INTER_NAME, GROUPLENS_NAME):
        if (folder / name).is_file():
            return folder / name
    _fetch(folder)
    return folder / INTER_NAME


def _fetch(folder: Path) -> None:
    """`pip download`s the recbole wheel (no dependencies) and extracts the one .inter file."""
    print(f"deql: downloading {PACKAGE_SPEC} (2 MB) from PyPI into {folder} ...", file=sys.stderr)
    try:
        wheels.extract_member(PACKAGE_SPEC, WHEEL_MEMBER, folder / INTER_NAME)
    except wheels.WheelError as e:
        raise DataError(
            f"{folder} has no {INTER_NAME} or {GROUPLENS_NAME} and {e}; offline, set "
            f"DEQL_DATA to a folder holding one of them"
        ) from None


# ---------------------------------------------------------------------------------------------
# Reading


def read_interactions(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(user tokens [N] str, item tokens [N] str, ratings [N] float64) from a recbole .inter
    file (header line of `name:type` fields) or a GroupLens u.data file (no header)."""
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise DataError(f"{path}: cannot read the ratings file ({e.strerror or e})") from None
    if not lines:
        raise DataError(f"{path}: the ratings file is empty")
    first = lines[0].split("\t")
    if ":" in first[0]:  # recbole header: find our columns by name
        names = [field.split(":")[0] for field in first]
        missing = [c for c in RECBOLE_COLUMNS if c not in names]
        if missing:
            raise DataError(f"{path}: line 1: the header lacks column(s) {', '.join(missing)}")
        cols = [names.index(c) for c in RECBOLE_COLUMNS]
        width, start = len(first), 1
    else:  # GroupLens u.data: user, item, rating, timestamp
        cols, width, start = [0, 1, 2], 4, 0
    users, items, ratings = [], [], []
    for number, line in enumerate(lines[start:], start=start + 1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != width:
            raise DataError(
                f"{path}: line {number}: expected {width} tab-separated fields, got {len(fields)}"
            )
        user, item, rating = (fields[c].strip() for c in cols)
        try:
            ratings.append(float(rating))
        except ValueError:
            raise DataError(f"{path}: line {number}: rating {rating!r} is not a number") from None
        if not user or not item:
            raise DataError(f"{path}: line {number}: empty user or item id")
        users.append(user)
        items.append(item)
    if not ratings:
        raise DataError(f"{path}: no ratings after the header")
    return np.array(users), np.array(items), np.array(ratings)


def binarise(users, items, ratings, threshold: float = 4.0) -> Interactions:
    """The user x item matrix of ratings >= `threshold` (ones; repeated pairs count once), with
    users and items that keep at least one such rating numbered 0.. in sorted-token order."""
    keep = ratings >= threshold
    if not keep.any():
        raise DataError(f"no rating is >= {threshold}: the binarised matrix would be empty")
    user_ids, rows = np.unique(users[keep], return_inverse=True)
    item_ids, cols = np.unique(items[keep], return_inverse=True)
    shape = (len(user_ids), len(item_ids))
    matrix = sp.csr_matrix((np.ones(len(rows), np.float32), (rows, cols)), shape=shape)
    matrix.data[:] = 1.0  # csr construction sums duplicates; a repeated rating is one interaction
    return Interactions(matrix, user_ids, item_ids)


def load_ml100k(path: str | os.PathLike | None = None, threshold: float = 4.0) -> Interactions:
    """MovieLens-100k, binarised (rating >= `threshold`), from `path` or `ml100k_path()`."""
    return binarise(*read_interactions(path or ml100k_path()), threshold=threshold)


# ---------------------------------------------------------------------------------------------
# Splits


def strong_split(
    X: sp.csr_matrix, *, n_val: int, n_test: int, seed: int, holdout: float = 0.2
) -> StrongSplit:
    """Held-out users (strong generalisation); see the module docstring."""
    X = sp.csr_matrix(X)
    eligible = _eligible(X)
    if n_val < 1 or n_test < 1 or n_val + n_test >= len(eligible):
        raise DataError(
            f"n_val={n_val}, n_test={n_test}: need both >= 1 and their sum below the "
            f"{len(eligible)} users with >= 2 interactions"
        )
    rng = np.random.default_rng(seed)
    held = rng.permutation(eligible)[: n_val + n_test]
    return _held_out(X, np.sort(held[:n_val]), np.sort(held[n_val:]), holdout, rng)


def user_folds(X: sp.csr_matrix, *, folds: int, seed: int) -> list[np.ndarray]:
    """The test users of each of `folds` folds (sorted rows of X): one seeded permutation of
    the users with >= 2 interactions cut into `folds` near-equal parts, so each is tested once."""
    eligible = _eligible(sp.csr_matrix(X))
    if not 2 <= folds <= len(eligible):
        raise DataError(f"folds={folds}: need 2 to {len(eligible)} (users with >= 2 items)")
    order = np.random.default_rng(seed).permutation(eligible)
    return [np.sort(part) for part in np.array_split(order, folds)]


def fold_split(
    X: sp.csr_matrix, *, fold: int, folds: int, n_val: int, seed: int, holdout: float = 0.2
) -> StrongSplit:
    """Fold `fold` of `folds`-fold cross-validation over users: its test users are
    `user_folds(...)[fold]`; `n_val` validation users are drawn (seeded by seed and fold) from
    the other eligible users; everyone else is fitted."""
    X = sp.csr_matrix(X)
    parts = user_folds(X, folds=folds, seed=seed)
    if not 0 <= fold < folds:
        raise DataError(f"fold={fold}: must be in [0, {folds})")
    test_users = parts[fold]
    others = np.setdiff1d(_eligible(X), test_users)
    if not 1 <= n_val < len(others):
        raise DataError(
            f"n_val={n_val}: need 1 to {len(others) - 1} (the fold's non-test users with >= 2 "
            "interactions; some must stay to be fitted)"
        )
    rng = np.random.default_rng([seed, fold])
    val_users = np.sort(rng.choice(others, size=n_val, replace=False))
    return _held_out(X, val_users, test_users, holdout, rng)


def require_tested_once(test_users: list, users) -> None:
    """A one-line DataError unless every user in `users` is in exactly one of the test-user
    sets (what K-fold cross-validation gives, and seeded random splits do not)."""
    tested = np.concatenate([np.asarray(t, int) for t in test_users])
    ids, counts = np.unique(tested, return_counts=True)
    twice, never = ids[counts > 1], np.setdiff1d(np.asarray(users, int), ids)
    if len(twice) or len(never):
        raise DataError(
            f"test users overlap or miss users: {len(twice)} tested more than once (e.g. "
            f"{twice[:3].tolist()}), {len(never)} never tested (e.g. {never[:3].tolist()})"
        )


def _eligible(X: sp.csr_matrix) -> np.ndarray:
    return np.flatnonzero(np.diff(X.indptr) >= 2)  # one fold-in and one held-out item at least


def _held_out(X, val_users, test_users, holdout: float, rng) -> StrongSplit:
    """The split with these validation and test users held out (fold-in / held-out drawn with
    `rng`, validation users first) and every other user fitted."""
    held = np.concatenate([val_users, test_users])
    train_users = np.setdiff1d(np.arange(X.shape[0]), held)
    train = X[train_users]
    items = np.flatnonzero(np.diff(train.tocsc().indptr))  # items seen in train
    if len(items) == 0:
        raise DataError("the train users have no interactions")
    val_in, val_out = _fold_in(X[val_users], holdout, rng)
    test_in, test_out = _fold_in(X[test_users], holdout, rng)
    cut = lambda m: sp.csr_matrix(m[:, items])
    parts = [cut(m) for m in (val_in, val_out, test_in, test_out)]
    dropped = X[held].nnz - sum(m.nnz for m in parts)
    return StrongSplit(cut(train), *parts, items, int(dropped), val_users, test_users)


def _fold_in(X: sp.csr_matrix, holdout: float, rng) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    """Each row's items split at random: round(holdout * count), at least 1 and at most
    count - 1, held out; the rest are fold-in."""
    out_mask = np.zeros(X.nnz, bool)
    for u in range(X.shape[0]):
        lo, hi = X.indptr[u], X.indptr[u + 1]
        n_out = min(max(round(holdout * (hi - lo)), 1), hi - lo - 1)
        out_mask[lo + rng.choice(hi - lo, size=n_out, replace=False)] = True
    return _select(X, ~out_mask), _select(X, out_mask)


def weak_split(X: sp.csr_matrix, *, seed: int, fractions=(0.7, 0.1, 0.2)) -> WeakSplit:
    """Every user's interactions split into train / val / test (weak generalisation)."""
    if len(fractions) != 3 or min(fractions) < 0 or abs(sum(fractions) - 1) > 1e-9:
        raise DataError(f"fractions={tuple(fractions)}: need three shares >= 0 summing to 1")
    X = sp.csr_matrix(X)
    rng = np.random.default_rng(seed)
    part = np.zeros(X.nnz, np.int8)  # 0 train, 1 val, 2 test
    for u in range(X.shape[0]):
        lo, hi = X.indptr[u], X.indptr[u + 1]
        n_val, n_test = round(fractions[1] * (hi - lo)), round(fractions[2] * (hi - lo))
        order = lo + rng.permutation(hi - lo)
        part[order[:n_val]] = 1
        part[order[n_val : n_val + n_test]] = 2
    train, val, test = (_select(X, part == k) for k in range(3))
    items = np.flatnonzero(np.diff(train.tocsc().indptr))
    if len(items) == 0:
        raise DataError("the train split has no interactions")
    cut = lambda m: sp.csr_matrix(m[:, items])
    val, test = cut(val), cut(test)
    return WeakSplit(cut(train), val, test, items, int(X.nnz - train.nnz - val.nnz - test.nnz))


def _select(X: sp.csr_matrix, keep: np.ndarray) -> sp.csr_matrix:
    """X with only the stored entries where `keep` (one flag per stored entry) is true."""
    rows = np.repeat(np.arange(X.shape[0]), np.diff(X.indptr))
    return sp.csr_matrix((X.data[keep], (rows[keep], X.indices[keep])), shape=X.shape)
