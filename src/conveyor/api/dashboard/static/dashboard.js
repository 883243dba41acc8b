// Conveyor dashboard. Keeps every [data-live] region current by fetching its HTML fragment
// (rendered by the server from the same template) every POLL_MS and patching the DOM in
// place, and sends operator actions to /api/v1 with fetch: the HttpOnly cookie
// authenticates, the X-Conveyor-Dashboard header is the API's CSRF check. No build step.
(() => {
  "use strict";
  const POLL_MS = 1500;
  const { call, apiError, link } = window.Conveyor; // api.js
  const regions = [...document.querySelectorAll("[data-live]")].map((el) => ({
    el, url: el.dataset.live, html: null, final: el.querySelector("[data-final]") !== null,
  }));
  const status = document.getElementById("live-status");
  let timer = null;

  function say(kind, text, link) {
    if (!status) return;
    status.dataset.state = kind;
    status.replaceChildren(text);
    if (link) {
      const a = document.createElement("a");
      a.href = link.href;
      a.textContent = link.text;
      status.append(" ", a);
    }
  }

  // -- patching: change only the nodes that differ, so that buttons under the pointer, links
  // and focus survive the refresh of a table whose ages tick every poll.
  function patch(from, to) {
    if (from.nodeType !== to.nodeType || from.nodeName !== to.nodeName) {
      from.replaceWith(to.cloneNode(true));
      return;
    }
    if (from.nodeType === Node.TEXT_NODE || from.nodeType === Node.COMMENT_NODE) {
      if (from.nodeValue !== to.nodeValue) from.nodeValue = to.nodeValue;
      return;
    }
    if (from.nodeType !== Node.ELEMENT_NODE) return;
    for (const attr of [...from.attributes]) if (!to.hasAttribute(attr.name)) from.removeAttribute(attr.name);
    for (const attr of [...to.attributes]) {
      if (from.getAttribute(attr.name) !== attr.value) from.setAttribute(attr.name, attr.value);
    }
    patchChildren(from, to);
  }

  function patchChildren(from, to) {
    const old = [...from.childNodes];
    const fresh = [...to.childNodes];
    fresh.forEach((node, i) => (i < old.length ? patch(old[i], node) : from.append(node.cloneNode(true))));
    old.slice(fresh.length).forEach((node) => node.remove());
  }

  class SignedOut extends Error {}

  async function refresh(region) {
    const response = await fetch(region.url, { headers: { Accept: "text/html" }, cache: "no-store" });
    if (response.status === 401) throw new SignedOut();
    if (!response.ok) throw new Error(`${response.status}: ${(await response.text()).slice(0, 200)}`);
    const html = await response.text();
    if (html !== region.html) {
      const fresh = document.createElement("template");
      fresh.innerHTML = html;
      // A <details> the reader opened (a chart's numbers) stays open: the server renders it closed.
      const opened = [...region.el.querySelectorAll("details[open][id]")].map((d) => d.id);
      patchChildren(region.el, fresh.content);
      for (const id of opened) document.getElementById(id)?.setAttribute("open", "");
      region.html = html;
    }
    region.final = region.el.querySelector("[data-final]") !== null;
  }

  let busy = false;
  let again = false;

  async function tick() {
    if (busy) {
      again = true; // one more round right after this one (an action just changed something)
      return;
    }
    busy = true;
    clearTimeout(timer);
    const due = regions.filter((r) => !r.final);
    if (!document.hidden && due.length) {
      try {
        await Promise.all(due.map(refresh));
        say("ok", `live · ${new Date().toLocaleTimeString()}`);
      } catch (err) {
        if (err instanceof SignedOut) {
          const here = location.pathname + location.search;
          say("error", "signed out: the token is invalid or revoked.",
              { href: `/login?next=${encodeURIComponent(here)}`, text: "Sign in again" });
        } else {
          say("error", `not updating: ${err.message}`);
        }
      }
    } else if (regions.length && !due.length) {
      say("ok", "final: nothing more will change");
    }
    busy = false;
    timer = setTimeout(tick, again ? 0 : POLL_MS);
    again = false;
  }

  // -- actions --------------------------------------------------------------------------------

  const post = (url, body) => call("POST", url, body);

  function show(element, kind, ...parts) {
    element.dataset.state = kind;
    element.replaceChildren(...parts);
  }

  const form = document.getElementById("request-form");
  if (form) {
    const actions = JSON.parse(document.getElementById("action-schemas").textContent);
    const select = form.elements.action_ref;
    const area = form.elements.parameters;
    const message = document.getElementById("request-message");
    const submit = document.getElementById("request-submit");
    const blank = { string: "", number: 0, integer: 0, boolean: false, array: [], object: {} };

    const skeleton = () => {
      const action = actions[select.value] || {};
      const schema = action.schema || {};
      const props = schema.properties || {};
      const value = {};
      for (const key of schema.required || []) value[key] = blank[(props[key] || {}).type] ?? null;
      area.value = JSON.stringify(value, null, 2);
      document.getElementById("request-description").textContent = action.description || "";
    };
    select.addEventListener("change", skeleton);
    if (select.value) skeleton();

    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      let parameters;
      try {
        parameters = JSON.parse(area.value.trim() || "{}");
      } catch (err) {
        show(message, "error", `The parameters are not valid JSON: ${err.message}`);
        return;
      }
      submit.disabled = true;
      show(message, "busy", "Requesting…");
      try {
        const response = await post("/api/v1/executions", { action_ref: select.value, parameters });
        if (!response.ok) {
          show(message, "error", `Refused: ${await apiError(response)}`);
          return;
        }
        const body = await response.json();
        message.dataset.executionId = body.id;
        show(message, "ok", "Requested ", link(`/executions/${body.id}`, `execution ${body.id}`), ` (${body.status}).`);
        tick();
      } catch (err) {
        show(message, "error", `Could not reach the API: ${err.message}`);
      } finally {
        submit.disabled = false;
      }
    });
  }

  // -- an inquiry's answer: its fields (generated from the schema by the server) or the JSON
  // text area, posted to the same verb the API and CLI use; the server checks the schema.
  const answerForm = document.getElementById("inquiry-form");
  if (answerForm) {
    const message = document.getElementById("inquiry-message");
    const submit = document.getElementById("inquiry-submit");

    const collect = () => {
      if (answerForm.dataset.mode === "json") {
        const text = document.getElementById("answer-json").value.trim();
        try {
          return { ok: true, data: JSON.parse(text) };
        } catch (err) {
          return { ok: false, error: `The answer is not valid JSON: ${err.message}` };
        }
      }
      let data = {};
      for (const input of answerForm.querySelectorAll("[data-field]")) {
        const raw = input.value.trim();
        if (raw === "") continue; // left out: the schema's "required" speaks for it
        let value = raw;
        if (input.dataset.kind === "choice") value = JSON.parse(raw);
        else if (input.dataset.kind === "number" || input.dataset.kind === "integer") value = Number(raw);
        if (input.dataset.field === "") data = value; // the schema is one value, not an object
        else data[input.dataset.field] = value;
      }
      return { ok: true, data };
    };

    answerForm.addEventListener("submit", async (event) => {
      event.preventDefault();
      const answer = collect();
      if (!answer.ok) {
        show(message, "error", answer.error);
        return;
      }
      submit.disabled = true;
      show(message, "busy", "Sending…");
      try {
        const response = await post(`/api/v1/inquiries/${answerForm.dataset.inquiry}/respond`, { data: answer.data });
        if (!response.ok) {
          show(message, "error", `Refused: ${await apiError(response)}`);
          return;
        }
        const body = await response.json();
        const text = body.outcome === "answered"
          ? "Answered: the execution goes on."
          : `Recorded (${body.responders.length} so far): more answers are needed.`;
        show(message, "ok", text);
        tick();
      } catch (err) {
        show(message, "error", `Could not reach the API: ${err.message}`);
      } finally {
        submit.disabled = false;
      }
    });
  }

  const workerMessage = document.getElementById("worker-message");
  document.addEventListener("click", async (event) => {
    const button = event.target.closest("button[data-worker-action]");
    if (!button || !workerMessage) return;
    const { workerAction: action, workerName: name, confirm: question } = button.dataset;
    if (question && !window.confirm(question)) return;
    show(workerMessage, "busy", `${action} ${name}…`);
    try {
      const response = await post(`/api/v1/workers/${encodeURIComponent(name)}/${action}`, {});
      if (!response.ok) {
        show(workerMessage, "error", `${action} ${name} refused: ${await apiError(response)}`);
        return;
      }
      const body = await response.json();
      const handed = body.handed_back ? `; ${body.handed_back} execution(s) handed back` : "";
      const done = { cordon: "cordoned", uncordon: "uncordoned", drain: "drained" }[action] || action;
      show(workerMessage, "ok", `${name}: ${done} (${body.status})${handed}.`);
      tick();
    } catch (err) {
      show(workerMessage, "error", `Could not reach the API: ${err.message}`);
    }
  });

  // -- live output (issue #15): the execution's chunks as its worker stores them, from the
  // API's server-sent events (the cookie authenticates; EventSource reconnects on its own,
  // resuming after the last chunk it got through Last-Event-ID). Text goes in with
  // textContent, never as markup; bytes that are not UTF-8 are shown as \xNN, as elsewhere.
  const liveOutput = document.querySelector("[data-output]");
  if (liveOutput && window.EventSource) {
    const pre = liveOutput.querySelector("pre");
    const state = document.getElementById("live-output-state");
    const hex = (b) => `\\x${b.toString(16).padStart(2, "0")}`;
    const bytesText = (b64) => {
      const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
      try {
        return new TextDecoder("utf-8", { fatal: true }).decode(bytes).replaceAll("\0", "\\x00");
      } catch {
        return [...bytes].map((b) => (b >= 0x20 && b < 0x7f) || b === 0x0a || b === 0x09 ? String.fromCharCode(b) : hex(b)).join("");
      }
    };
    let attempt = null;
    let chunks = 0;
    const source = new EventSource(liveOutput.dataset.output);
    source.addEventListener("output", (event) => {
      const chunk = JSON.parse(event.data);
      if (attempt !== null && chunk.attempt !== attempt) {
        const mark = document.createElement("span");
        mark.className = "attempt-mark";
        mark.textContent = `--- attempt ${chunk.attempt} ---\n`;
        pre.append(mark);
      }
      attempt = chunk.attempt;
      const span = document.createElement("span");
      span.className = `stream-${chunk.stream}`;
      span.textContent = chunk.encoding === "base64" ? bytesText(chunk.data) : chunk.data;
      pre.append(span);
      chunks += 1;
      state.textContent = "Following: new output appears as the worker sends it (stderr and log lines in colour).";
    });
    source.addEventListener("end", () => {
      source.close();
      state.textContent = chunks ? "Ended: all of its output is above." : "Ended without printing anything.";
    });
    source.addEventListener("open", () => {
      if (!chunks) state.textContent = "Following: nothing printed yet.";
    });
    source.addEventListener("error", () => {
      if (source.readyState !== EventSource.CLOSED) state.textContent = "Connection lost: reconnecting…";
    });
  }

  document.addEventListener("visibilitychange", () => document.hidden || tick());
  document.addEventListener("conveyor:changed", () => tick()); // actions.js changed something: refresh now
  if (regions.length && regions.every((r) => r.final)) say("ok", "final: nothing more will change");
  if (regions.length) timer = setTimeout(tick, POLL_MS);
})();
