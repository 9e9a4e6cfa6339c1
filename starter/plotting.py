"""Plots shared by the notebooks. Every figure gets a title, axis labels and, for heat maps, a colour bar."""
from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np


def _as_numpy(x) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().float().numpy()
    return np.asarray(x)


def show_attention(weights, queries: Sequence[str] | None = None, keys: Sequence[str] | None = None,
                   title: str = "attention weights", ax=None, cmap: str = "viridis", annotate: bool | None = None):
    """Heat map of one attention matrix.

    Args:
        weights: (T_q, T_k) tensor or array; row t is the distribution of query t over the keys.
        queries, keys: optional labels for the rows and columns.
        annotate: write each weight in its cell (default: when the matrix is small).
    Returns the matplotlib Axes.
    """
    w = _as_numpy(weights)
    if w.ndim != 2:
        raise ValueError(f"show_attention expects a (T_q, T_k) matrix, got shape {w.shape}")
    if ax is None:
        _, ax = plt.subplots(figsize=(1.0 + 0.45 * w.shape[1], 0.8 + 0.4 * w.shape[0]))
    im = ax.imshow(w, cmap=cmap, vmin=0.0, vmax=max(1e-9, float(w.max())), aspect="auto")
    ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="weight")
    ax.set_xticks(range(w.shape[1]))
    ax.set_yticks(range(w.shape[0]))
    ax.set_xticklabels(list(keys) if keys is not None else range(w.shape[1]), rotation=60, ha="right")
    ax.set_yticklabels(list(queries) if queries is not None else range(w.shape[0]))
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    ax.set_title(title)
    if annotate is None:
        annotate = w.size <= 64
    if annotate:
        for i in range(w.shape[0]):
            for j in range(w.shape[1]):
                ax.text(j, i, f"{w[i, j]:.2f}", ha="center", va="center", fontsize=7,
                        color="white" if w[i, j] < 0.6 * w.max() else "black")
    return ax


def show_matrix(values, title: str, xlabel: str, ylabel: str, ax=None, cmap: str = "RdBu_r",
                symmetric: bool = True, colorbar_label: str = "value"):
    """Heat map of any 2-D array (e.g. positions x dimensions), with a colour bar."""
    v = _as_numpy(values)
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 4))
    lim = float(np.abs(v).max()) if symmetric else None
    im = ax.imshow(v, cmap=cmap, aspect="auto", vmin=-lim if symmetric else None, vmax=lim)
    ax.figure.colorbar(im, ax=ax, label=colorbar_label)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    return ax


def show_heads(weights, queries: Sequence[str] | None = None, keys: Sequence[str] | None = None,
               title: str = "attention weights per head", cmap: str = "viridis", ncols: int = 4):
    """One heat map per attention head, sharing one colour scale.

    Args:
        weights: (H, T_q, T_k) tensor or array (one batch element of a multi-head layer's weights).
        queries, keys: optional labels for the rows and columns.
    Returns the matplotlib Figure.
    """
    w = _as_numpy(weights)
    if w.ndim != 3:
        raise ValueError(f"show_heads expects (heads, T_q, T_k) weights, got shape {w.shape}")
    heads = w.shape[0]
    ncols = min(ncols, heads)
    nrows = -(-heads // ncols)
    cell = 0.35 * max(w.shape[1], w.shape[2]) + 1.2
    fig, axes = plt.subplots(nrows, ncols, figsize=(cell * ncols + 1.5, cell * nrows + 0.8), squeeze=False,
                             sharex=True, sharey=True, layout="constrained")
    vmax = max(1e-9, float(w.max()))
    for h, ax in enumerate(axes.flat):
        if h >= heads:
            ax.axis("off")
            continue
        im = ax.imshow(w[h], cmap=cmap, vmin=0.0, vmax=vmax, aspect="auto")
        ax.set_title(f"head {h}")
        ax.set_xticks(range(w.shape[2]))
        ax.set_yticks(range(w.shape[1]))
        ax.set_xticklabels(list(keys) if keys is not None else range(w.shape[2]), rotation=60, ha="right", fontsize=7)
        ax.set_yticklabels(list(queries) if queries is not None else range(w.shape[1]), fontsize=7)
        ax.tick_params(labelleft=h % ncols == 0)
        ax.set_xlabel("key")
        if h % ncols == 0:
            ax.set_ylabel("query")
    fig.colorbar(im, ax=axes.ravel().tolist(), fraction=0.03, pad=0.02, label="weight")
    fig.suptitle(title)
    return fig


def show_similarity_vs_distance(pe, anchors: Sequence[int] = (0, 20, 40), ax=None,
                                title: str = "dot product of positional encodings against distance"):
    """Line plot of PE(p) . PE(q) against q - p, for a few anchor positions p.

    Args:
        pe: (max_len, d) positional encodings, row t = PE(t).
        anchors: positions p to compare every other position with.
    Returns the matplotlib Axes.
    """
    pe = _as_numpy(pe).astype(np.float64)
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 3.8))
    positions = np.arange(pe.shape[0])
    for p in anchors:
        ax.plot(positions - p, pe @ pe[p], label=f"p = {p}")
    ax.axvline(0, color="gray", lw=0.8, ls="--")
    ax.set_xlabel("distance q - p (positions)")
    ax.set_ylabel("PE(p) · PE(q)")
    ax.set_title(title)
    ax.legend(title="anchor")
    return ax
