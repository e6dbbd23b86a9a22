// The web page's script: polls the server-rendered fragments under /ui/ and swaps them in,
// opens a deployment's details from the URL hash, stops deployments, and drives the deploy
// form (dry run, then deploy). Plain JS, no dependencies: the page must work offline.
"use strict";

(function () {
  const TOKEN_KEY = "cohabit-token";
  const pollMs = Number(document.body.dataset.pollMs) || 2000;
  const live = document.getElementById("live");
  const message = document.getElementById("message");
  const tokenForm = document.getElementById("token-form");
  const details = document.getElementById("details");
  const detailsBody = document.getElementById("details-body");
  const formHolder = document.getElementById("deploy-form");
  const preview = document.getElementById("preview");
  let previewSeq = 0;

  class HttpError extends Error {
    constructor(status, text) {
      super(text);
      this.status = status;
    }
  }

  function headers(extra) {
    const h = Object.assign({}, extra || {});
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (token) h.Authorization = "Bearer " + token;
    return h;
  }

  // The server's {"detail": …} in one line: a string, FastAPI's list of problems, or a NoFit.
  function describe(body, status) {
    const detail = body && body.detail;
    if (typeof detail === "string") return detail;
    if (Array.isArray(detail)) {
      return detail
        .map((p) => (p.loc ? p.loc.filter((x) => x !== "body").join(".") + ": " : "") + p.msg)
        .join("; ");
    }
    if (detail && detail.reason) return detail.reason + ": " + detail.message;
    return "request failed (HTTP " + status + ")";
  }

  async function call(path, options) {
    const opts = Object.assign({}, options || {});
    opts.headers = headers(opts.headers);
    let response;
    try {
      response = await fetch(path, opts);
    } catch (err) {
      throw new HttpError(0, "the server does not answer (" + err.message + ")");
    }
    if (response.status === 401) {
      tokenForm.hidden = false;
      throw new HttpError(401, "this server wants an API token: enter it above");
    }
    if (!response.ok) {
      let body = null;
      try {
        body = await response.json();
      } catch (_err) {
        body = null;
      }
      const error = new HttpError(response.status, describe(body, response.status));
      error.body = body;
      throw error;
    }
    return response;
  }

  async function postJson(path, body) {
    return call(path, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
    });
  }

  function say(text, tone) {
    message.textContent = text;
    message.className = "message message-" + (tone || "info");
    message.hidden = !text;
  }

  // Swap a fragment's HTML only when it changed, and give focus back to the same control.
  function swap(holder, html) {
    if (holder.dataset.html === html) return;
    const active = document.activeElement;
    const key = active && holder.contains(active) ? focusKey(active) : null;
    holder.innerHTML = html;
    holder.dataset.html = html;
    if (key) {
      const again = holder.querySelector(key);
      if (again) again.focus();
    }
  }

  function focusKey(el) {
    if (el.id) return "#" + CSS.escape(el.id);
    if (el.dataset.stop) return '[data-stop="' + CSS.escape(el.dataset.stop) + '"]';
    const href = el.getAttribute("href");
    if (href) return 'a[href="' + CSS.escape(href) + '"]';
    return null;
  }

  async function load(holder) {
    const url = holder.dataset.fragment;
    if (!url) return;
    const response = await call(url);
    swap(holder, await response.text());
  }

  async function refresh() {
    const holders = document.querySelectorAll("[data-poll]");
    try {
      await Promise.all(Array.from(holders).map(load));
      live.textContent = "live · updated " + new Date().toLocaleTimeString();
      live.classList.remove("offline");
    } catch (err) {
      live.textContent = "offline: " + err.message;
      live.classList.add("offline");
      if (err.status === 404 && !details.hidden) closeDetails();
    }
  }

  function loop() {
    const tick = async () => {
      if (!document.hidden) await refresh();
      window.setTimeout(tick, pollMs);
    };
    tick();
    window.setInterval(countLoads, 200);
  }

  // A load's phase counts on between polls: the server said how long it had lasted when it
  // made the fragment; the next poll brings the phase and the figure afresh.
  function countLoads() {
    const now = performance.now();
    document.querySelectorAll("[data-elapsed-s]").forEach((el) => {
      if (!el.dataset.shownAt) el.dataset.shownAt = String(now);
      const elapsed = Number(el.dataset.elapsedS) + (now - Number(el.dataset.shownAt)) / 1000;
      el.textContent = "loading: " + el.dataset.phase + " " + elapsed.toFixed(1) + " s";
    });
  }

  // Details: #/deployment/<id> opens them (the links in the map and the table point there).
  function route() {
    const match = /^#\/deployment\/([0-9a-f-]{36})$/.exec(location.hash);
    if (!match) {
      details.hidden = true;
      delete detailsBody.dataset.poll;
      delete detailsBody.dataset.fragment;
      return;
    }
    details.hidden = false;
    detailsBody.dataset.fragment = "/ui/deployments/" + match[1];
    detailsBody.dataset.poll = "";
    detailsBody.dataset.html = "";
    detailsBody.innerHTML = '<p class="muted">loading…</p>';
    load(detailsBody).catch((err) => say(err.message, "bad"));
    document.getElementById("details-title").focus();
  }

  function closeDetails() {
    history.pushState(null, "", location.pathname);
    route();
  }

  async function stop(button) {
    const name = button.dataset.name || "this deployment";
    if (!window.confirm("Stop " + name + "? Its budget is released.")) return;
    button.disabled = true;
    try {
      const response = await call("/api/serving/deployment/" + button.dataset.stop, {
        method: "DELETE",
      });
      const stopped = await response.json();
      say(stopped ? "Stopped " + name + "." : name + " had already ended.", "ok");
    } catch (err) {
      say("Could not stop " + name + ": " + err.message, "bad");
    } finally {
      button.disabled = false;
      await refresh();
    }
  }

  // --- the deploy form ----------------------------------------------------------------------

  function field(name) {
    return document.getElementById("f-" + name);
  }

  function selectedConfig() {
    const select = field("config");
    return select ? select.options[select.selectedIndex] : null;
  }

  // Show only the chosen model's configs; keep the chosen one if it belongs, else its default.
  function filterConfigs(keep) {
    const model = field("model").value;
    const select = field("config");
    const mine = [];
    for (const option of select.options) {
      const ours = option.dataset.model === model;
      option.hidden = !ours;
      option.disabled = !ours;
      if (ours) mine.push(option);
    }
    const choice =
      mine.find((o) => o.value === keep) || mine.find((o) => "default" in o.dataset) || mine[0];
    if (choice) select.value = choice.value;
  }

  function syncContext() {
    const option = selectedConfig();
    field("ctx").value = option && option.dataset.ctx ? option.dataset.ctx : "";
  }

  // A typed context length becomes the model's config with that length (found or made).
  async function configForContext() {
    const option = selectedConfig();
    const ctx = field("ctx").value.trim();
    if (!option || !ctx || ctx === option.dataset.ctx) return option ? option.value : null;
    const response = await postJson("/ui/context-config", {
      m_id: field("model").value,
      m_config_id: option.value,
      max_model_len: Number(ctx),
    });
    const made = await response.json();
    await loadForm({ m_id: field("model").value, m_config_id: made.m_config_id });
    return made.m_config_id;
  }

  function body(configId) {
    const out = { m_id: field("model").value, m_config_id: configId };
    if (field("engine").value) out.engine_name = field("engine").value;
    return out;
  }

  async function checkFit() {
    const seq = ++previewSeq;
    try {
      const configId = await configForContext();
      if (!configId) return;
      const response = await postJson("/ui/preview", body(configId));
      const html = await response.text();
      if (seq === previewSeq) preview.innerHTML = html;
    } catch (err) {
      if (seq === previewSeq) {
        preview.innerHTML = "";
        const p = document.createElement("p");
        p.className = "verdict verdict-bad";
        p.textContent = err.message;
        preview.appendChild(p);
      }
    }
  }

  async function deploy(event) {
    event.preventDefault();
    const button = field("deploy");
    button.disabled = true;
    try {
      const configId = await configForContext();
      const response = await postJson("/api/serving/deploy_model", body(configId));
      const id = await response.json();
      say("Deploying " + field("model").selectedOptions[0].text + "…", "ok");
      location.hash = "#/deployment/" + id;
      await refresh();
    } catch (err) {
      say("Not deployed: " + err.message, "bad");
      if (err.status === 409) await checkFit();
    } finally {
      button.disabled = false;
    }
  }

  async function loadForm(keep) {
    await load(formHolder);
    const form = document.getElementById("deploy-form-el");
    if (!form) return;
    if (keep) {
      field("model").value = keep.m_id;
      filterConfigs(keep.m_config_id);
    } else {
      filterConfigs(null);
    }
    syncContext();
  }

  formHolder.addEventListener("change", (event) => {
    const id = event.target.id;
    if (id === "f-model") {
      filterConfigs(null);
      syncContext();
    } else if (id === "f-config") {
      syncContext();
    }
    checkFit();
  });
  formHolder.addEventListener("click", (event) => {
    if (event.target.id === "f-check") checkFit();
  });
  formHolder.addEventListener("submit", deploy);

  document.addEventListener("click", (event) => {
    const button = event.target.closest("[data-stop]");
    if (button) stop(button);
    if (event.target.closest("#details .close")) {
      event.preventDefault();
      closeDetails();
    }
  });
  document.addEventListener("keydown", (event) => {
    if (event.key === "Escape" && !details.hidden) closeDetails();
  });
  tokenForm.addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, document.getElementById("token").value);
    tokenForm.hidden = true;
    say("", "info");
    loadForm(null).then(checkFit, (err) => say(err.message, "bad"));
    refresh();
  });
  window.addEventListener("hashchange", route);

  route();
  loop();
  loadForm(null).then(checkFit, (err) => say(err.message, "bad"));
})();
