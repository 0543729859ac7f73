(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("attention-data").textContent);
  const STOPS = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
  const state = { kind: 0, layer: 0, head: "avg", query: null, key: null };
  const $ = (id) => document.getElementById(id);

  function colour(w) {
    const x = Math.max(0, Math.min(1, w)) * (STOPS.length - 1);
    const i = Math.min(Math.floor(x), STOPS.length - 2), f = x - i;
    const c = STOPS[i].map((v, j) => Math.round(v + f * (STOPS[i + 1][j] - v)));
    return "rgb(" + c.join(",") + ")";
  }
  function kind() { return data.kinds[state.kind]; }
  function matrix() {
    const heads = kind().weights[state.layer];
    if (state.head !== "avg") return heads[state.head];
    return heads[0].map((row, q) => row.map((_, k) =>
      heads.reduce((s, h) => s + h[q][k], 0) / heads.length));
  }
  function option(value, text) {
    const o = document.createElement("option");
    o.value = value; o.textContent = text; return o;
  }
  function fillControls() {
    const kinds = $("kind");
    data.kinds.forEach((k, i) => kinds.appendChild(option(i, k.title)));
    kinds.addEventListener("change", () => { state.kind = +kinds.value; resetKind(); });
    $("layer").addEventListener("change", () => { state.layer = +$("layer").value; draw(); });
    resetKind();
  }
  function resetKind() {
    const k = kind(), layers = $("layer"), heads = $("heads");
    state.layer = Math.min(state.layer, k.weights.length - 1);
    state.query = null; state.key = null;
    layers.replaceChildren(...k.weights.map((_, i) => option(i, "layer " + i)));
    layers.value = state.layer;
    const buttons = k.weights[0].map((_, h) => [h, "head " + h]);
    buttons.push(["avg", "all heads average"]);
    heads.replaceChildren(...buttons.map(([h, text]) => {
      const b = document.createElement("button");
      b.type = "button"; b.dataset.head = h; b.textContent = text;
      b.addEventListener("click", () => { state.head = h === "avg" ? "avg" : +h; draw(); });
      return b;
    }));
    if (state.head !== "avg" && state.head >= k.weights[0].length) state.head = "avg";
    draw();
  }
  function header(text, cls, onClick) {
    const th = document.createElement("th");
    th.className = cls; th.textContent = text; th.title = text;
    th.addEventListener("click", onClick); return th;
  }
  function drawTable(m) {
    const k = kind(), table = $("heatmap");
    table.dataset.kind = k.name; table.dataset.layer = state.layer;
    table.dataset.head = state.head;
    const top = document.createElement("tr");
    top.appendChild(document.createElement("th"));
    k.keys.forEach((t, j) => {
      const th = header(t, "key", () => select(null, j));
      if (state.key === j) th.classList.add("on");
      top.appendChild(th);
    });
    const rows = [top];
    m.forEach((row, q) => {
      const tr = document.createElement("tr");
      if (state.query === q) tr.classList.add("hi");
      const th = header(k.queries[q], "query", () => select(q, null));
      if (state.query === q) th.classList.add("on");
      tr.appendChild(th);
      row.forEach((w, j) => {
        const td = document.createElement("td");
        td.className = "cell"; td.dataset.q = q; td.dataset.k = j;
        td.dataset.w = w.toFixed(4); td.style.background = colour(w);
        td.title = k.queries[q] + " \u2192 " + k.keys[j] + ": " + w.toFixed(4);
        if (state.key === j) td.classList.add("hi");
        td.addEventListener("mouseenter", () => {
          $("info").textContent = "query \u201c" + k.queries[q] + "\u201d gives key \u201c" +
            k.keys[j] + "\u201d weight " + w.toFixed(4);
        });
        td.addEventListener("click", () => select(q, null));
        tr.appendChild(td);
      });
      rows.push(tr);
    });
    table.replaceChildren(...rows);
  }
  function strip(id, tokens, shade, chosen, onClick) {
    $(id).replaceChildren(...tokens.map((t, i) => {
      const s = document.createElement("span");
      s.textContent = t;
      if (shade) {
        s.style.background = colour(shade[i]);
        s.style.color = shade[i] > 0.6 ? "#222" : "#fff";
        s.title = shade[i].toFixed(4);
      }
      if (chosen === i) s.classList.add("on");
      s.addEventListener("click", () => onClick(i));
      return s;
    }));
  }
  function drawStrips(m) {
    const k = kind();
    const fromQuery = state.query === null ? null : m[state.query];
    const toKey = state.key === null ? null : m.map((row) => row[state.key]);
    strip("queries", k.queries, toKey, state.query, (q) => select(q, null));
    strip("keys", k.keys, fromQuery, state.key, (j) => select(null, j));
    let text = "Click a query token to see where it attends, or a key token to see " +
      "which queries attend to it.";
    if (fromQuery) text = "Keys shaded by the attention of query \u201c" +
      k.queries[state.query] + "\u201d (its row sums to 1).";
    if (toKey) text = "Queries shaded by the attention they give key \u201c" +
      k.keys[state.key] + "\u201d (its column).";
    $("legend").textContent = text;
  }
  function drawImage(m) {
    const canvas = $("image");
    if (!data.image || !canvas) return;
    const [rows, cols] = data.image.grid, px = data.image.pixels;
    const h = px.length, w = px[0].length, scale = Math.max(1, Math.floor(256 / w));
    canvas.width = w * scale; canvas.height = h * scale;
    const ctx = canvas.getContext("2d");
    for (let y = 0; y < h; y++) for (let x = 0; x < w; x++) {
      const p = px[y][x], c = Array.isArray(p) ? p : [p, p, p];
      ctx.fillStyle = "rgb(" + c.join(",") + ")";
      ctx.fillRect(x * scale, y * scale, scale, scale);
    }
    const q = state.query === null ? 0 : state.query, weights = m[q].slice(1);
    const top = Math.max(...weights, 1e-12);
    ctx.globalAlpha = 0.55;
    weights.forEach((v, i) => {
      const r = Math.floor(i / cols), c = i % cols;
      ctx.fillStyle = colour(v / top);
      ctx.fillRect(c * canvas.width / cols, r * canvas.height / rows,
        canvas.width / cols, canvas.height / rows);
    });
    ctx.globalAlpha = 1;
    $("image-note").textContent = "where \u201c" + kind().queries[q] +
      "\u201d looks among the patches (brightest = most)";
  }
  function select(q, j) {
    state.query = q === state.query ? null : q;
    state.key = j === state.key ? null : j;
    draw();
  }
  function draw() {
    const m = matrix();
    drawTable(m); drawStrips(m); drawImage(m);
    document.querySelectorAll("#heads button").forEach((b) => {
      b.classList.toggle("on", String(state.head) === b.dataset.head);
    });
  }
  fillControls();
})();
