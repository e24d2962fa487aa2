"""A profile's ops as flat arrays: each op's outputs and reads in CSR form, each
storage's producer op, checked as arrays (a failed check walks the profile again to name
the first bad value), and per op the prefix end from which every replay of its unit runs
it (``fixed_from``, a numba kernel). ``scheduler.flat.flatten`` lays a profile out with
them; the array names are the legend's in ``scheduler.kernels``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from scheduler.checks import int_column, region_label
from scheduler.kernels import njit
from scheduler.profile import Profile

__all__ = ["fixed_from", "op_outputs", "op_reads", "producer_ops"]


def _csr_rows(lens: Any) -> tuple[np.ndarray, np.ndarray]:
    """Row pointers for rows of these lengths, and the row of each entry."""
    lens_arr = np.asarray(lens, dtype=np.int64)
    ptr = np.zeros(lens_arr.shape[0] + 1, dtype=np.int64)
    np.cumsum(lens_arr, out=ptr[1:])
    return ptr, np.repeat(np.arange(lens_arr.shape[0], dtype=np.int64), lens_arr)


def op_outputs(
    profile: Profile,
    raw: list[Any],
    lens: list[int],
    op_base: np.ndarray,
    op_m: np.ndarray,
    skip: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Op outputs in CSR form (flat storage indices, -1 kept) and which ops replay may serve."""
    n_ops = len(lens)
    out_ptr, owner = _csr_rows(lens)
    arr, ok = int_column(raw)
    m = np.asarray(op_m, dtype=np.int64)[owner] if n_ops else np.zeros(0, dtype=np.int64)
    if ok and arr.size:
        ok = bool(np.all((arr >= -1) & (arr < m)))
    if not ok:
        for r in profile.regions:
            k = len(r.storages)
            for j, op in enumerate(r.ops):
                for o in op.outputs:
                    if (
                        isinstance(o, bool)
                        or not isinstance(o, (int, np.integer))
                        or not -1 <= o < k
                    ):
                        raise ValueError(
                            f"op {j} of region {region_label(r)} has output {o!r}; accepted: -1 or "
                            f"a storage index in 0..{k - 1}"
                        )
    arr = arr.astype(np.int64)
    base = np.asarray(op_base, dtype=np.int64)[owner] if n_ops else np.zeros(0, dtype=np.int64)
    out_idx = np.where(arr >= 0, arr + base, -1).astype(np.int64)
    has_unsaved = np.bincount(owner[arr < 0], minlength=n_ops) > 0
    op_serv = (
        np.asarray(skip, dtype=np.bool_) & ~has_unsaved if n_ops else np.zeros(0, dtype=np.bool_)
    )
    return out_ptr, out_idx, op_serv


def op_reads(
    profile: Profile,
    raw: list[Any],
    lens: np.ndarray,
    op_start: np.ndarray,
    op_count: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Op reads in CSR form as global op indices (rows of non-dataflow units are empty)."""
    rd_ptr, owner = _csr_rows(lens)
    arr, ok = int_column(raw)
    if ok and arr.size:
        ok = bool(np.all((arr >= 0) & (arr < op_count[owner])))
    if not ok:
        for r in profile.regions:
            k = len(r.ops)
            for j, op in enumerate(r.ops):
                for x in op.reads or ():
                    if (
                        isinstance(x, bool)
                        or not isinstance(x, (int, np.integer))
                        or not 0 <= x < k
                    ):
                        raise ValueError(
                            f"op {j} of region {region_label(r)} reads op {x!r}; accepted: an op "
                            f"index in 0..{k - 1}"
                        )
    rd_idx = (arr.astype(np.int64) + op_start[owner]).astype(np.int64)
    return rd_ptr, rd_idx


def producer_ops(
    profile: Profile, raw: list[Any], base: np.ndarray, n_arr: np.ndarray
) -> np.ndarray:
    """Per flat storage its producer as a global op index, -1 when unknown (``base``, ``n_arr``:
    per storage the first global op index and the op count of its unit)."""
    arr, ok = int_column(raw)
    if ok and arr.size:
        ok = bool(np.all((arr >= -1) & ((arr < n_arr) | (n_arr == 0))))
    if not ok:

        def good(s: Any, k: int) -> bool:
            p = s.producer_op
            return bool(
                isinstance(p, (int, np.integer))
                and not isinstance(p, bool)
                and p >= -1
                and (p < k or k == 0)
            )

        for r in profile.regions:
            k = len(r.ops)
            for i, st in enumerate(r.storages):
                if not good(st, k):
                    raise ValueError(
                        f"storage {i} of region {region_label(r)} producer_op = "
                        f"{st.producer_op!r} is invalid; accepted: -1 or an op index in "
                        f"0..{k - 1}"
                    )
    arr = arr.astype(np.int64)
    return np.where((arr >= 0) & (n_arr > 0), arr + base, -1).astype(np.int64)


@njit
def fixed_from(op_ptr, op_serv, op_sink, op_view, rd_ptr, rd_idx, dataflow):  # type: ignore[no-untyped-def]
    """``FlatProfile.fixed_from``: per op the prefix end from which it always runs."""
    n_u = op_ptr.shape[0] - 1
    out = np.empty(op_serv.shape[0], dtype=np.int64)
    stack = np.empty(op_serv.shape[0], dtype=np.int64)
    for u in range(n_u):
        j0 = op_ptr[u]
        n = op_ptr[u + 1] - j0
        for jj in range(n):
            out[j0 + jj] = n + 1
        if not dataflow[u]:
            for jj in range(n):
                if not op_serv[j0 + jj]:
                    out[j0 + jj] = jj + 1
            continue
        # a view runs whenever it lies in the prefix, and no closure enters it (its reads
        # are not followed); a never-servable sink runs whenever it lies in the prefix
        # (served or not, under both replay rules); so does every never-servable op it
        # reaches through reads of earlier ops that are no views (the profile contract; a
        # read of a later op is not followed here)
        for jj in range(n):
            if op_view[j0 + jj]:
                out[j0 + jj] = jj + 1
        for jj in range(n):
            j = j0 + jj
            if not op_sink[j] or op_serv[j] or out[j] <= n:
                continue
            out[j] = jj + 1
            top = 1
            stack[0] = j
            while top > 0:
                top -= 1
                i = stack[top]
                for q in range(rd_ptr[i], rd_ptr[i + 1]):
                    r = rd_idx[q]
                    if r >= i or op_serv[r] or out[r] <= n:
                        continue
                    out[r] = jj + 1
                    stack[top] = r
                    top += 1
    return out
