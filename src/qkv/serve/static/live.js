(function () {
  "use strict";
  // The field of each text endpoint's list of inputs (see the service's OpenAPI page).
  const FIELDS = { "/v1/translate": "sentences", "/v1/tag": "sentences", "/v1/classify": "texts" };
  const WAIT_MS = 400; // typing pauses this long before the page asks again
  const $ = (id) => document.getElementById(id);
  let models = [], image = null, ticket = 0, timer = null;

  function current() { return models.find((m) => m.name === $("model").value); }
  function status(text, bad) {
    $("status").textContent = text; $("status").classList.toggle("bad", !!bad);
  }
  async function call(url, init) {
    const response = await fetch(url, init);
    const body = await response.json();
    if (!response.ok) throw new Error(body.error || response.statusText);
    return body;
  }
  function postJson(body) {
    return { method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body) };
  }
  function postImage(model) {
    const form = new FormData();
    form.append("model", model.name);
    form.append("image", image, image.name || "image.png");
    return { method: "POST", body: form };
  }
  function lines(body) {
    const p = (x) => x.label + " (probability " + x.probability.toFixed(2) + ")";
    if (body.translations) return body.translations;
    if (body.tags) return body.tags.map((ws) => ws.map((w) => w.word + "/" + w.tag).join(" "));
    if (body.labels) return body.labels.map(p);
    return [p(body)];
  }
  function showExplorer(data) {
    const box = $("explorer");
    box.replaceChildren($("explorer-template").content.cloneNode(true));
    if (!data.image) $("image-box").remove();
    $("attention-data").textContent = JSON.stringify(data);
    const script = document.createElement("script");
    script.textContent = $("explorer-code").textContent; // draws into the fresh markup
    box.appendChild(script);
  }
  async function run() {
    const model = current();
    if (!model) return;
    const mine = ++ticket;
    let body, data;
    try {
      if (model.input === "image") {
        if (!image) { status("drop an image first"); return; }
        status("working\u2026");
        body = await call(model.endpoint, postImage(model));
        data = await call("/v1/attention-image", postImage(model));
      } else {
        const inputs = $("text").value.split("\n").map((s) => s.trim()).filter(Boolean);
        if (!inputs.length) { status("type a sentence first"); return; }
        status("working\u2026");
        const request = { model: model.name };
        request[FIELDS[model.endpoint]] = inputs;
        body = await call(model.endpoint, postJson(request));
        data = await call("/v1/attention", postJson({ model: model.name, text: inputs[0] }));
      }
    } catch (error) {
      if (mine === ticket) status(error.message, true);
      return;
    }
    if (mine !== ticket) return; // a newer request is on its way
    $("result").textContent = lines(body).join("\n");
    showExplorer(data);
    status("attention of the " + (model.input === "image" ? "image" : "first line"));
  }
  function chooseModel() {
    const model = current(), reads = model && model.input === "image";
    $("text-input").hidden = !!reads; $("image-input").hidden = !reads;
    const facts = [model.job];
    if (model.languages) facts.push(model.languages.source + " \u2192 " + model.languages.target);
    if (model.labels) facts.push(model.labels.length + " labels");
    facts.push(model.sizes.parameters.toLocaleString() + " parameters");
    $("about").textContent = facts.join(", ");
    $("result").textContent = ""; $("explorer").replaceChildren(); status("");
  }
  function setImage(file) {
    if (!file) return;
    image = file; $("drop").classList.remove("over"); run();
  }
  async function start() {
    try {
      models = (await call("/v1/models")).models;
    } catch (error) { status(error.message, true); return; }
    $("model").replaceChildren(...models.map((m) => {
      const o = document.createElement("option");
      o.value = m.name; o.textContent = m.name + " (" + m.job + ")"; return o;
    }));
    chooseModel();
    $("model").addEventListener("change", () => { chooseModel(); run(); });
    $("run").addEventListener("click", run);
    $("text").addEventListener("input", () => { clearTimeout(timer); timer = setTimeout(run, WAIT_MS); });
    $("file").addEventListener("change", () => setImage($("file").files[0]));
    const drop = $("drop");
    drop.addEventListener("dragover", (e) => { e.preventDefault(); drop.classList.add("over"); });
    drop.addEventListener("dragleave", () => drop.classList.remove("over"));
    drop.addEventListener("drop", (e) => { e.preventDefault(); setImage(e.dataTransfer.files[0]); });
  }
  start();
})();
