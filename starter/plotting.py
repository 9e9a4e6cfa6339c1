"""Plots shared by the notebooks. Every figure gets a title, axis labels and, for heat maps, a colour bar."""
from __future__ import annotations

from collections.abc import Sequence

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
    im = ax.imshow(v, cmap=cmap, aspect="auto", vmin=None if lim is None else -lim, vmax=lim)
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


# --------------------------------------------------------------------------------------------------
# Notebook 07: attention over image regions and over the words of a caption

def _image_extent(image) -> tuple[int, int]:
    img = _as_numpy(image)
    return img.shape[0], img.shape[1]


def _outline(ax, image_shape, grid_shape, boxes, grid_alpha: float) -> None:
    """Faint lines between the feature-grid cells, and dashed boxes (x0, y0, x1, y1) around objects."""
    if grid_shape is not None:
        gh, gw = grid_shape
        for r in range(1, gh):
            ax.axhline(r * image_shape[0] / gh - 0.5, color="white", lw=0.3, alpha=grid_alpha)
        for c in range(1, gw):
            ax.axvline(c * image_shape[1] / gw - 0.5, color="white", lw=0.3, alpha=grid_alpha)
    for x0, y0, x1, y1 in boxes:
        ax.add_patch(plt.Rectangle((x0, y0), x1 - x0, y1 - y0, fill=False, ec="white", lw=1.2, ls="--"))


def overlay_attention(image, heat, ax=None, title: str = "attention over the image", alpha: float = 0.55,
                      cmap: str = "jet", grid_shape: tuple[int, int] | None = None, colorbar: bool = True,
                      boxes: Sequence[tuple[float, float, float, float]] = ()):
    """The image with an attention map laid over it (the "Show, Attend and Tell" picture).

    Args:
        image: (H_img, W_img, 3) uint8 (or float in [0, 1]) array.
        heat: (H_img, W_img) map already upsampled to the image size, values in [0, 1] (peak = 1).
        grid_shape: optional (H, W) feature grid; draws its cell borders as thin lines.
        boxes: optional (x0, y0, x1, y1) pixel boxes drawn in white (e.g. the object a word names).
    Returns the matplotlib Axes (the colour bar is labelled "attention (peak = 1)").
    """
    img = _as_numpy(image)
    h = _as_numpy(heat).astype(np.float64)
    if h.shape != img.shape[:2]:
        raise ValueError(f"heat map has shape {h.shape} but the image is {img.shape[:2]}: upsample it first")
    if ax is None:
        _, ax = plt.subplots(figsize=(4, 4))
    ax.imshow(img)
    im = ax.imshow(h, cmap=cmap, alpha=alpha, vmin=0.0, vmax=1.0)
    _outline(ax, img.shape, grid_shape, boxes, grid_alpha=0.5)
    ax.set_xlim(-0.5, img.shape[1] - 0.5)
    ax.set_ylim(img.shape[0] - 0.5, -0.5)
    ax.set_title(title)
    ax.set_xlabel("x (pixels)")
    ax.set_ylabel("y (pixels)")
    if colorbar:
        ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="attention (peak = 1)")
    return ax


def show_word_overlays(image, heats, words: Sequence[str], title: str = "attention while generating each word",
                       ncols: int = 5, grid_shape: tuple[int, int] | None = None, cmap: str = "jet",
                       boxes: dict[int, Sequence[tuple]] | None = None, alpha: float = 0.55):
    """One panel per generated word: the image with the cross-attention of the step that produced it.

    Args:
        image: (H_img, W_img, 3) array.
        heats: (N, H_img, W_img) maps already upsampled to the image size, values in [0, 1].
        words: the N words (panel titles).
        boxes: optional {panel index: [(x0, y0, x1, y1), ...]} boxes to outline on that panel.
    The first panel is the plain image. Returns the matplotlib Figure (one shared colour bar).
    """
    img = _as_numpy(image)
    h = _as_numpy(heats)
    if h.ndim != 3 or len(h) != len(words):
        raise ValueError(f"expected (N, H_img, W_img) maps for {len(words)} words, got shape {h.shape}")
    panels = len(words) + 1
    ncols = min(ncols, panels)
    nrows = -(-panels // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(2.3 * ncols + 1.0, 2.5 * nrows + 0.6), squeeze=False,
                             layout="constrained")
    im = None
    for k, ax in enumerate(axes.flat):
        ax.set_xticks([])
        ax.set_yticks([])
        if k >= panels:
            ax.axis("off")
            continue
        ax.imshow(img)
        if k == 0:
            ax.set_title("image", fontsize=10)
        else:
            im = ax.imshow(h[k - 1], cmap=cmap, alpha=alpha, vmin=0.0, vmax=1.0)
            ax.set_title(f"{k}: \u201c{words[k - 1]}\u201d", fontsize=10)
            _outline(ax, img.shape, grid_shape, (boxes or {}).get(k - 1, ()), grid_alpha=0.4)
        if k % ncols == 0:
            ax.set_ylabel("y (pixels)")
        if k // ncols == nrows - 1 or k + ncols >= panels:
            ax.set_xlabel("x (pixels)")
    if im is not None:
        fig.colorbar(im, ax=axes.ravel().tolist(), fraction=0.025, pad=0.02, label="attention (peak = 1)")
    fig.suptitle(title)
    return fig


def show_attention_layers(weights, queries: Sequence[str] | None = None, keys: Sequence[str] | None = None,
                          title: str = "self-attention per layer and head", cmap: str = "viridis"):
    """A grid of heat maps: one row per layer, one column per head, one shared colour scale.

    Args:
        weights: (L, H, T_q, T_k) tensor or array (one caption).
        queries, keys: token labels of the rows and columns (drawn on the outer panels only).
    Returns the matplotlib Figure.
    """
    w = _as_numpy(weights)
    if w.ndim != 4:
        raise ValueError(f"show_attention_layers expects (layers, heads, T_q, T_k), got shape {w.shape}")
    layers, heads, tq, tk = w.shape
    cell = 0.28 * max(tq, tk) + 0.9
    fig, axes = plt.subplots(layers, heads, figsize=(cell * heads + 2.2, cell * layers + 1.2), squeeze=False,
                             sharex=True, sharey=True, layout="constrained")
    vmax = max(1e-9, float(w.max()))
    for l in range(layers):
        for h in range(heads):
            ax = axes[l, h]
            im = ax.imshow(w[l, h], cmap=cmap, vmin=0.0, vmax=vmax, aspect="equal")
            ax.set_xticks(range(tk))
            ax.set_yticks(range(tq))
            ax.set_xticklabels(list(keys) if keys is not None else range(tk), rotation=90, fontsize=7)
            ax.set_yticklabels(list(queries) if queries is not None else range(tq), fontsize=7)
            ax.tick_params(labelbottom=l == layers - 1, labelleft=h == 0, length=2)
            if l == 0:
                ax.set_title(f"head {h}", fontsize=10)
            if h == 0:
                ax.set_ylabel(f"layer {l}\nquery (input token)", fontsize=9)
            if l == layers - 1:
                ax.set_xlabel("key (input token)", fontsize=9)
    fig.colorbar(im, ax=axes.ravel().tolist(), fraction=0.03, pad=0.02, label="weight")
    fig.suptitle(title)
    return fig


def plot_losses(history, title: str = "training loss", ax=None):
    """Training loss per step (light) and its moving average, plus validation loss if recorded.

    history: dict with "step", "loss" and optionally "val_step", "val_loss" (from starter.training.train).
    """
    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 3.6))
    steps, loss = np.asarray(history["step"]), np.asarray(history["loss"], dtype=float)
    ax.plot(steps, loss, color="tab:blue", alpha=0.3, lw=1, label="train (per step)")
    if len(loss) >= 10:
        k = max(5, len(loss) // 30)
        smooth = np.convolve(loss, np.ones(k) / k, mode="valid")
        ax.plot(steps[k - 1:], smooth, color="tab:blue", lw=2, label=f"train (mean of {k} steps)")
    if history.get("val_loss"):
        ax.plot(history["val_step"], history["val_loss"], "o-", color="tab:orange", label="validation")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy per word (nats)")
    ax.set_yscale("log")
    ax.set_title(title)
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    return ax


def show_captions(images, generated: Sequence[str], references: Sequence[Sequence[str] | str],
                  ncols: int = 3, title: str = "generated (bold) vs ground truth", max_refs: int = 3,
                  label: str = "generated"):
    """Images with a caption each (bold, after `label`: a model's "generated" one, or one of the data's) and their
    ground-truth captions underneath.

    images: list of (H, W, 3) arrays (None for an image that is not available);
    generated: one string per image; references: list of strings (or one string) per image.
    Returns the matplotlib Figure.
    """
    import textwrap

    n = len(generated)
    ncols = max(1, min(ncols, n))
    nrows = -(-n // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 5.6 * nrows), squeeze=False)
    for i, ax in enumerate(axes.flat):
        ax.axis("off")
        if i >= n:
            continue
        img = images[i] if images is not None else None
        if img is not None:
            ax.imshow(np.asarray(img))
        else:
            ax.text(0.5, 0.5, "(no image)", ha="center", va="center", transform=ax.transAxes)
        refs = [references[i]] if isinstance(references[i], str) else list(references[i])
        gen = "\n".join(textwrap.wrap(f"{label}: {generated[i]}", 42))
        truth = "\n".join("\n".join(textwrap.wrap(f"truth: {r}", 42)) for r in refs[:max_refs])
        ax.set_title(gen, fontsize=9, fontweight="bold", loc="left")
        ax.text(0.0, -0.03, truth, fontsize=8, va="top", ha="left", transform=ax.transAxes, color="0.25")
    fig.suptitle(title)
    fig.tight_layout()
    # room for the ground truth under each image, and for the figure title above the first row's captions
    fig.subplots_adjust(hspace=0.6 if nrows > 1 else None, top=1 - 0.75 / (5.6 * nrows))
    return fig
