"""One self-contained HTML page to explore a run's attention on one input.

The page works offline from a file: its CSS and JavaScript (``static/explorer.css`` and
``static/explorer.js``, package data of ``qkv.viz``) are inlined and the weights are embedded
as JSON, so it needs no server, no network and no library. The reader picks the
kind of attention, the layer and a head (or the average of all heads); the heatmap is an
HTML table whose cells carry their weight in ``data-w``. Clicking a query token shows where
it attends; clicking a key token shows which queries attend to it.
"""

from __future__ import annotations

import html
import json
from functools import cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from qkv import checkpoint as ckpt

if TYPE_CHECKING:
    from qkv.viz.attention import RunAttention

DIGITS = 4  # decimals of the embedded weights: enough for colours and for reading them
SCRIPT_FILE = "explorer.js"
STYLE_FILE = "explorer.css"


# The explorer's markup up to the legend: the ids explorer.js draws into. The served live
# page (qkv.serve.page) uses the same.
EXPLORER_CONTROLS = """<div id="controls">
  <label>attention <select id="kind"></select></label>
  <label><select id="layer"></select></label>
  <span id="heads"></span>
</div>
<div id="scale">weight 0 <span></span> 1</div>
<div id="info"></div>
<div id="layout">
  <table id="heatmap"></table>
  <div id="side">
    <p>Each row is a query token; its cells are its weights over the keys, a softmax of
    q&middot;k/&radic;d<sub>k</sub> that sums to 1. The output at that token is the weighted
    sum of the values.</p>
    <div>query tokens:</div><div class="tokens" id="queries"></div>
    <div>key tokens:</div><div class="tokens" id="keys"></div>
    <p id="legend"></p>
"""


@cache
def static_text(name: str) -> str:
    """The text of ``qkv/viz/static/NAME``, read from the installed package."""
    return (resources.files("qkv.viz") / "static" / name).read_text(encoding="utf-8")


def page_data(attention: RunAttention) -> dict[str, Any]:
    """The JSON the page embeds: texts, token names and the rounded weights of every kind."""
    data: dict[str, Any] = {
        "job": attention.job,
        "input": attention.input,
        "output": attention.output,
        "kinds": [
            {
                "name": k.name,
                "title": k.title,
                "queries": k.queries,
                "keys": k.keys,
                "weights": np.round(k.weights.astype(np.float64), DIGITS).tolist(),  # (L,H,Q,K)
            }
            for k in attention.kinds
        ],
        "image": None,
    }
    if attention.image is not None:
        pixels = np.clip(np.round(attention.image * 255), 0, 255).astype(int)
        data["image"] = {"pixels": pixels.tolist(), "grid": list(attention.grid)}
    return data


def _embed_json(data: Any) -> str:
    """JSON that cannot end the <script> element it sits in, whatever the tokens hold."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def attention_page(attention: RunAttention, title: str = "qkv: attention explorer") -> str:
    """The whole page as one string of HTML."""
    e = html.escape
    what = "image" if attention.image is not None else "input"
    image = (
        '<div><canvas id="image"></canvas><div id="image-note"></div></div>'
        if attention.image is not None
        else ""
    )
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{e(title)}</title>
<link rel="icon" href="data:,">
<style>
{static_text(STYLE_FILE)}</style>
</head>
<body>
<h1>{e(title)}</h1>
<div class="io"><b>run</b> {e(attention.job)}</div>
<div class="io"><b>{what}</b> {e(attention.input)}</div>
<div class="io" id="output"><b>output</b> {e(attention.output)}</div>
{EXPLORER_CONTROLS}    {image}
  </div>
</div>
<script id="attention-data" type="application/json">{_embed_json(page_data(attention))}</script>
<script>
{static_text(SCRIPT_FILE)}</script>
</body>
</html>
"""


def write_attention_page(attention: RunAttention, path: str | Path) -> Path:
    """Write ``attention_page`` to ``path`` (atomically); return the path."""
    path = Path(path)
    ckpt.write_text(path, attention_page(attention))
    return path
