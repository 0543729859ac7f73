"""The service's live page at ``/``: pick a model, give it text or an image, see the output
and, beside it, the attention explorer for that input.

Offline like the explorer: one HTML document with its CSS and JavaScript inlined, no external
script or font. The explorer is the one ``qkv attention --html`` writes (``qkv.viz.page``):
its markup is cloned from a template for each answer, its data is the JSON of
``/v1/attention``, and its script (``qkv/viz/static/explorer.js``) is run again on it.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from qkv.viz.page import EXPLORER_CONTROLS, SCRIPT_FILE, STYLE_FILE
from qkv.viz.page import static_text as explorer_text

TITLE = "qkv: live attention"

# The explorer's markup, with the ids explorer.js draws into (as qkv.viz.page writes them).
EXPLORER = (
    '<template id="explorer-template">\n'
    + EXPLORER_CONTROLS
    + """    <div id="image-box"><canvas id="image"></canvas><div id="image-note"></div></div>
  </div>
</div>
<script id="attention-data" type="application/json">{}</script>
</template>"""
)


@cache
def static_text(name: str) -> str:
    """The text of ``qkv/serve/static/NAME``, read from the installed package."""
    return (resources.files("qkv.serve") / "static" / name).read_text(encoding="utf-8")


def live_page() -> str:
    """The whole page as one string of HTML."""
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{TITLE}</title>
<link rel="icon" href="data:,">
<style>
{explorer_text(STYLE_FILE)}{static_text("live.css")}</style>
</head>
<body>
<h1>{TITLE}</h1>
<div id="app">
  <div id="left">
    <label>model <select id="model"></select></label>
    <div id="about"></div>
    <div id="text-input">
      <textarea id="text" rows="5" placeholder="type or paste text, one sentence a line"></textarea>
    </div>
    <div id="image-input" hidden>
      <div id="drop">drop an image here, or <input type="file" id="file" accept="image/*"></div>
    </div>
    <button type="button" id="run">run</button> <span id="status"></span>
    <h2>output</h2>
    <pre id="result"></pre>
  </div>
  <div id="explorer"></div>
</div>
{EXPLORER}
<script id="explorer-code" type="text/plain">
{explorer_text(SCRIPT_FILE)}</script>
<script>
{static_text("live.js")}</script>
</body>
</html>
"""
