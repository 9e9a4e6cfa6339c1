"""An attention explorer that runs offline: one self-contained HTML output, with its data and its script inline.

Pick an image, click (or hover) a generated word, and the picture shows that word's cross-attention over the image
regions, for the chosen layer and head or the mean of the heads; the caption shows the same step's self-attention
over the earlier words. Switching layer, head or word runs no Python: every weight is in the page.

Why one HTML output and not a widget: an HTML output with an inline script is drawn by Jupyter Notebook 7,
JupyterLab, VS Code and Colab alike, needs no extension or kernel-side package (anywidget and ipywidgets need both
on the front end, and Colab needs its custom-widget manager switched on for them), and keeps working in the
executed HTML page of a notebook, where no kernel exists at all. Nothing is loaded from the network:
the image is a `data:` PNG, the drawing is a `<canvas>`, the script is a few dozen lines of plain JavaScript.
Where scripts don't run (a notebook JupyterLab does not trust, GitHub's viewer), the output says so in one line.

Data format (`AttentionExplorer.data`, also the shipped reference run's `explorer.json`):
    {"version": 1, "grid": [H, W], "layers": L, "heads": heads, "scale": 10000,
     "captions": [{"title": str, "image": "data:image/png;base64,..." or None, "tokens": ["<START>", w1, ..., "<END>"],
                   "cross": L x heads x n x R ints, "self": L x heads x n x n ints, "views": {name: n x R ints}}]}
where n = len(tokens) - 1 steps: step k reads tokens[0..k] and produces tokens[k + 1]; a weight w is stored as
round(w * scale). "views" are extra maps over the regions, one per step (for example a rollout over the layers).
"""
from __future__ import annotations

import base64
import html
import io
import json
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

SCALE = 10_000          # weights are stored as integers: round(weight * SCALE), 4 decimals
MAX_ALPHA = 200         # the overlay's opacity at a map's peak (of 255); zero attention is transparent
MAX_BYTES = 600_000     # an explorer of notebook 09's size (12 captions, 2 layers, 4 heads, 7 x 7 grid) stays under
REFERENCE = Path("reference_run") / "09_visualizing_attention" / "explorer.json"


def _numpy(x) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=np.float64)


def _png_data_url(image) -> str | None:
    if image is None:
        return None
    from PIL import Image

    array = np.asarray(image)
    if array.dtype != np.uint8:
        array = (np.clip(array, 0, 1) * 255).round().astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(array).save(out, format="PNG", optimize=True)
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode("ascii")


def _stored(weights: np.ndarray) -> list:
    return np.rint(weights * SCALE).astype(np.int64).tolist()


def explorer_caption(words: Sequence[str], cross, self_attn, image=None, title: str = "",
                     views: Mapping[str, object] | None = None) -> dict:
    """One caption of the explorer.

    Args:
        words: the generated words, without <START> and <END>; n = len(words) + 1 steps (the last produced <END>).
        cross: (L, heads, T, R) cross-attention of the run on <START> + words (T >= n; rows past n are ignored).
        self_attn: (L, heads, T, T) self-attention of the same run.
        image: (height, width, 3) uint8 (or floats in [0, 1]), or None (fc7 features have no picture).
        views: extra maps {name: (T, R)} over the regions, one row per step.
    """
    cross, self_attn = _numpy(cross), _numpy(self_attn)
    n = len(words) + 1
    if cross.ndim != 4 or self_attn.ndim != 4:
        raise ValueError(f"cross and self_attn must be (L, heads, T, S); got shapes {cross.shape} and {self_attn.shape}")
    if cross.shape[:2] != self_attn.shape[:2]:
        raise ValueError(f"cross {cross.shape} and self_attn {self_attn.shape} differ in layers or heads")
    if cross.shape[2] < n or self_attn.shape[2] < n or self_attn.shape[3] < n:
        raise ValueError(f"{len(words)} words need {n} steps of attention; got cross {cross.shape}, self {self_attn.shape}")
    out_views = {}
    for name, v in (views or {}).items():
        v = _numpy(v)
        if v.ndim != 2 or v.shape[0] < n or v.shape[1] != cross.shape[3]:
            raise ValueError(f"view {name!r} must be (steps >= {n}, R = {cross.shape[3]}); got {v.shape}")
        out_views[str(name)] = _stored(v[:n])
    return {"title": title, "image": _png_data_url(image), "tokens": ["<START>", *map(str, words), "<END>"],
            "cross": _stored(cross[:, :, :n]), "self": _stored(self_attn[:, :, :n, :n]), "views": out_views}


class AttentionExplorer:
    """The explorer of a list of captions (`explorer_caption`) over a grid of regions; displays itself in a notebook."""

    def __init__(self, captions: Sequence[dict], grid_shape: tuple[int, int], title: str = "attention explorer"):
        if not captions:
            raise ValueError("the explorer needs at least one caption")
        H, W = map(int, grid_shape)
        first = np.asarray(captions[0]["cross"])
        for c in captions:
            shape = np.asarray(c["cross"]).shape
            if shape[:2] != first.shape[:2] or shape[3] != H * W:
                raise ValueError(f"caption {c.get('title')!r}: cross-attention {shape} does not fit "
                                 f"{first.shape[0]} layers, {first.shape[1]} heads and a {H} x {W} grid")
        self.data: dict[str, Any] = {"version": 1, "title": title, "grid": [H, W], "layers": int(first.shape[0]),
                     "heads": int(first.shape[1]), "scale": SCALE, "max_alpha": MAX_ALPHA, "captions": list(captions)}

    @classmethod
    def from_json(cls, path: str | Path) -> AttentionExplorer:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        if data.get("version") != 1 or data.get("scale") != SCALE:
            raise ValueError(f"{path}: not an explorer file of this kit (version {data.get('version')!r})")
        return cls(data["captions"], tuple(data["grid"]), data.get("title", "attention explorer"))

    def to_json(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.data, separators=(",", ":")), encoding="utf-8")
        return path

    def html(self) -> str:
        """The explorer as an HTML fragment: its style, its data and its script, nothing loaded from elsewhere."""
        uid = "ae-" + uuid.uuid4().hex[:10]
        # "</" inside a script element would end it: JSON allows "<\/" for "</"
        data = json.dumps(self.data, separators=(",", ":")).replace("</", "<\\/")
        page = _TEMPLATE.replace("__SCRIPT__", _SCRIPT).replace("__UID__", uid)
        return page.replace("__TITLE__", html.escape(self.data["title"])).replace("__DATA__", data)

    def __len__(self) -> int:
        return len(self.data["captions"])

    def attention(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """(cross (L, heads, n, R), self (L, heads, n, n)) of caption i, as stored (4 decimals)."""
        c = self.data["captions"][i]
        return np.asarray(c["cross"], dtype=np.float64) / SCALE, np.asarray(c["self"], dtype=np.float64) / SCALE

    def add_view(self, name: str, maps: Sequence) -> None:
        """Add a map over the regions for every step of every caption: maps[i] is (n_i, R), or (T >= n_i, R)."""
        if len(maps) != len(self):
            raise ValueError(f"view {name!r}: {len(maps)} maps for {len(self)} captions")
        H, W = self.data["grid"]
        for c, m in zip(self.data["captions"], maps):
            m, n = _numpy(m), len(c["tokens"]) - 1
            if m.ndim != 2 or m.shape[0] < n or m.shape[1] != H * W:
                raise ValueError(f"view {name!r}: caption {c['title']!r} needs ({n}, {H * W}) maps; got {m.shape}")
            c.setdefault("views", {})[str(name)] = _stored(m[:n])

    def without_views(self) -> AttentionExplorer:
        """The same captions with no extra views (what the reference run ships: attention only)."""
        return AttentionExplorer([{**c, "views": {}} for c in self.data["captions"]], tuple(self.data["grid"]),
                                 self.data["title"])

    def _repr_html_(self) -> str:
        return self.html()

    def save(self, path: str | Path) -> Path:
        """A standalone page holding the explorer (open it in any browser, offline)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{html.escape(self.data['title'])}"
                        f"</title></head><body>{self.html()}</body></html>\n", encoding="utf-8")
        return path


def explorer_from_run(words, attn, grid_shape, images=None, titles=None, views=None,
                      title="attention explorer") -> AttentionExplorer:
    """The explorer of a batch run by a captioner: words[b] the generated words of image b, attn the model's dict
    {"self": [(B, heads, T, T)] * L, "cross": [(B, heads, T, R)] * L} of the run on <START> + words; views a dict
    {name: (B, T, R)} of extra maps."""
    import torch

    cross, self_attn = torch.stack(list(attn["cross"]), 1), torch.stack(list(attn["self"]), 1)  # (B, L, heads, T, S)
    captions = [explorer_caption(w, cross[b], self_attn[b], image=None if images is None else images[b],
                                 title="" if titles is None else titles[b],
                                 views={k: v[b] for k, v in (views or {}).items()})
                for b, w in enumerate(words)]
    return AttentionExplorer(captions, grid_shape, title)


def reference_explorer(root: str | Path | None = None) -> AttentionExplorer:
    """The explorer of the course's reference run, shipped with the kit (`reference_run/09_visualizing_attention/explorer.json`)."""
    candidates = [Path(root)] if root is not None else [Path(__file__).resolve().parents[1], Path.cwd(),
                                                         Path("/content/attention-transformers")]
    for base in candidates:
        if (base / REFERENCE).is_file():
            return AttentionExplorer.from_json(base / REFERENCE)
    raise FileNotFoundError(f"{REFERENCE} is not in {', '.join(map(str, candidates))}: it comes with the course "
                            "repository (a clone, or /content/attention-transformers on Colab)")


_TEMPLATE = """<div class="attention-explorer" id="__UID__" tabindex="0">
<style>
#__UID__ {font: 13px/1.4 system-ui, sans-serif; color: #222; max-width: 760px; outline: none;}
#__UID__ .ae-row {display: flex; flex-wrap: wrap; gap: 4px; align-items: center; margin: 4px 0;}
#__UID__ button {font: inherit; padding: 1px 8px; border: 1px solid #999; border-radius: 3px; background: #f4f4f4; cursor: pointer;}
#__UID__ button.on {background: #2a6fdb; color: #fff; border-color: #2a6fdb;}
#__UID__ button:disabled {opacity: 0.4; cursor: default;}
#__UID__ .ae-token {padding: 1px 4px; margin: 1px; border-radius: 3px; border: 1px solid transparent; cursor: pointer;}
#__UID__ .ae-token.start {cursor: default; color: #777;}
#__UID__ .ae-token.chosen {border-color: #d62728; font-weight: 600;}
#__UID__ .ae-token.later {color: #aaa;}
#__UID__ canvas.ae-picture {border: 1px solid #ccc; image-rendering: auto;}
#__UID__ .ae-readout {font-size: 12px; color: #444; min-height: 2.8em;}
</style>
<div class="ae-nojs">The attention explorer (__TITLE__) draws with JavaScript, which did not run here. In JupyterLab or
Notebook 7, trust the notebook (File &rarr; Trust Notebook) or run the cell again; the executed HTML page and Colab run it as they are.</div>
<script type="application/json" class="ae-data">__DATA__</script>
<div class="ae-ui" style="display:none">
<div class="ae-row"><b>__TITLE__</b></div>
<div class="ae-row">image <select class="ae-caption"></select></div>
<div class="ae-row ae-layers">map:</div>
<div class="ae-row ae-heads">head:</div>
<div class="ae-row ae-tokens"></div>
<div class="ae-row" style="align-items:flex-start"><canvas class="ae-picture" width="336" height="336"></canvas>
<div style="flex:1; min-width:220px"><div class="ae-readout"></div>
<div style="font-size:11px; color:#666">Click or hover a word: the picture shows the cross-attention of the step that
produced it (each map scaled to its own peak); the words before it are shaded by the same step's self-attention.
Arrow keys move along the caption.</div></div></div>
<canvas class="ae-cells" style="display:none"></canvas>
</div>
</div>
<script>
__SCRIPT__
</script>"""

_SCRIPT = r"""(function () {
  const root = document.getElementById("__UID__") || document.currentScript.previousElementSibling;
  if (!root || root.dataset.ready) return;
  root.dataset.ready = "1";
  const D = JSON.parse(root.querySelector(".ae-data").textContent);
  const [H, W] = D.grid, S = D.scale;
  root.querySelector(".ae-nojs").style.display = "none";
  root.querySelector(".ae-ui").style.display = "";
  const picture = root.querySelector(".ae-picture"), cells = root.querySelector(".ae-cells");
  cells.width = W; cells.height = H;
  const state = {caption: 0, map: "0", head: "mean", word: 0};
  state.map = String(D.layers - 1);
  const jet = v => {  // matplotlib's "jet", piecewise linear
    const f = t => Math.round(255 * Math.max(0, Math.min(1, t)));
    return [f(1.5 - Math.abs(4 * v - 3)), f(1.5 - Math.abs(4 * v - 2)), f(1.5 - Math.abs(4 * v - 1))];
  };
  const el = (tag, text, cls) => { const e = document.createElement(tag); if (text !== undefined) e.textContent = text; if (cls) e.className = cls; return e; };
  const images = D.captions.map(c => { if (!c.image) return null; const im = new Image(); im.src = c.image; return im; });

  function weights() {  // the drawn map: R weights of the chosen step
    const c = D.captions[state.caption], k = state.word;
    if (!/^[0-9]+$/.test(state.map)) return c.views[state.map][k].map(x => x / S);
    const layer = c.cross[+state.map];
    if (state.head !== "mean") return layer[+state.head][k].map(x => x / S);
    const out = new Array(H * W).fill(0);
    layer.forEach(h => h[k].forEach((x, r) => { out[r] += x / S / layer.length; }));
    return out;
  }
  function selfRow() {  // the same step's self-attention over <START> and the earlier words, or null for a view
    const c = D.captions[state.caption], k = state.word;
    const m = /^[0-9]+$/.test(state.map) ? +state.map : D.layers - 1;
    const layer = c.self[m];
    if (state.head !== "mean") return layer[+state.head][k].slice(0, k + 1).map(x => x / S);
    const out = new Array(k + 1).fill(0);
    layer.forEach(h => { for (let j = 0; j <= k; j++) out[j] += h[k][j] / S / layer.length; });
    return out;
  }
  function draw() {
    const c = D.captions[state.caption], w = weights(), peak = Math.max(...w);
    const ctx = cells.getContext("2d"), px = ctx.createImageData(W, H);
    w.forEach((x, r) => {
      const v = peak > 0 ? x / peak : 0, [R, G, B] = jet(v);
      px.data.set([R, G, B, Math.round(D.max_alpha * v)], 4 * r);
    });
    ctx.putImageData(px, 0, 0);
    const p = picture.getContext("2d"), im = images[state.caption];
    p.clearRect(0, 0, picture.width, picture.height);
    if (im && im.complete) p.drawImage(im, 0, 0, picture.width, picture.height);
    else { p.fillStyle = "#ddd"; p.fillRect(0, 0, picture.width, picture.height); }
    p.imageSmoothingEnabled = true;  // bilinear, between cell centres: the notebook's upsample_attention
    p.drawImage(cells, 0, 0, picture.width, picture.height);
    const row = selfRow(), top = Math.max(...row);
    root.querySelectorAll(".ae-token").forEach((t, j) => {
      t.classList.toggle("chosen", j === state.word + 1);
      t.classList.toggle("later", j > state.word + 1);
      const a = j <= state.word ? row[j] : 0;
      t.dataset.weight = j <= state.word ? a.toFixed(4) : "";
      t.style.background = j <= state.word && top > 0 ? `rgba(255, 140, 0, ${(a / top).toFixed(3)})` : "";
    });
    const best = w.indexOf(peak), k = state.word, word = c.tokens[k + 1];
    const from = /^[0-9]+$/.test(state.map) ? `layer ${state.map}, ${state.head === "mean" ? "mean of the heads" : "head " + state.head}` : state.map;
    const most = row.indexOf(top);
    root.querySelector(".ae-readout").textContent =
      `\u201c${word}\u201d (step ${k}) \u00b7 ${from}: peak on region ${best} (row ${Math.floor(best / W)}, column ${best % W}), ` +
      `weight ${peak.toFixed(3)}, ${(w.reduce((a, b) => a + b, 0)).toFixed(3)} in all. Self-attention: most on \u201c${c.tokens[most]}\u201d (${top.toFixed(3)}).`;
    root.dataset.drawn = [state.caption, state.map, state.head, state.word].join("|");
  }
  function buttons(box, items, key) {
    box.querySelectorAll("button").forEach(b => b.remove());
    items.forEach(([value, label]) => {
      const b = el("button", label); b.dataset.value = value;
      b.onclick = () => { state[key] = value; refresh(); };
      box.appendChild(b);
    });
  }
  function refresh() {
    const c = D.captions[state.caption];
    state.word = Math.min(state.word, c.tokens.length - 2);
    root.querySelectorAll(".ae-layers button").forEach(b => b.classList.toggle("on", b.dataset.value === state.map));
    const isLayer = /^[0-9]+$/.test(state.map);
    root.querySelectorAll(".ae-heads button").forEach(b => { b.classList.toggle("on", b.dataset.value === state.head); b.disabled = !isLayer; });
    draw();
  }
  function caption(i) {
    state.caption = i; state.word = 0;
    const c = D.captions[i], box = root.querySelector(".ae-tokens");
    box.replaceChildren();
    c.tokens.forEach((t, j) => {
      const s = el("span", t, "ae-token" + (j === 0 ? " start" : ""));
      if (j > 0) {
        s.onclick = () => { state.word = j - 1; pinned = j - 1; refresh(); };
        s.onmouseenter = () => { state.word = j - 1; refresh(); };
        s.onmouseleave = () => { state.word = pinned; refresh(); };
      }
      box.appendChild(s);
    });
    const views = Object.keys(c.views || {});
    buttons(root.querySelector(".ae-layers"), [...Array(D.layers).keys()].map(l => [String(l), `layer ${l}`]).concat(views.map(v => [v, v])), "map");
    if (!/^[0-9]+$/.test(state.map) && !views.includes(state.map)) state.map = String(D.layers - 1);
    pinned = 0;
    refresh();
  }
  let pinned = 0;
  buttons(root.querySelector(".ae-heads"), [["mean", "mean"]].concat([...Array(D.heads).keys()].map(h => [String(h), `head ${h}`])), "head");
  const select = root.querySelector(".ae-caption");
  D.captions.forEach((c, i) => { const o = el("option", c.title || c.tokens.slice(1, -1).join(" ")); o.value = i; select.appendChild(o); });
  select.onchange = () => caption(+select.value);
  root.addEventListener("keydown", e => {
    const n = D.captions[state.caption].tokens.length - 1;
    if (e.key === "ArrowRight" || e.key === "ArrowLeft") {
      pinned = state.word = Math.max(0, Math.min(n - 1, state.word + (e.key === "ArrowRight" ? 1 : -1)));
      refresh(); e.preventDefault();
    }
  });
  images.forEach(im => { if (im) im.onload = () => draw(); });
  caption(0);
})();"""
