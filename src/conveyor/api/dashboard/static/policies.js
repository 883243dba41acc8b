// Conveyor dashboard, /policies (issue #15): set a policy (PUT /api/v1/policies/{target})
// and delete one (DELETE, after a confirmation), through the REST API the CLI uses, with
// the X-Conveyor-Dashboard header the API requires of a cookie-authenticated change. The
// server renders the controls for admins only (the API's role for policies); a refusal
// shows the API's own message. Text goes in with textContent, never as markup.
(() => {
  "use strict";
  const { call, apiError, changed } = window.Conveyor; // api.js
  const message = document.getElementById("policy-message");
  if (!message) return;

  function show(kind, text) {
    message.dataset.state = kind;
    message.textContent = text;
  }

  const url = (target) => `/api/v1/policies/${encodeURIComponent(target)}`;

  const form = document.getElementById("policy-form");
  if (form) {
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const { target, concurrency, group_by: groupBy, method } = form.elements;
      const name = target.value.trim();
      const body = {
        concurrency: Number(concurrency.value),
        parameters: groupBy.value.split(",").map((p) => p.trim()).filter((p) => p),
        method: method.value,
      };
      show("busy", `Setting the policy for ${name}…`);
      try {
        const response = await call("PUT", url(name), body);
        if (!response.ok) {
          show("error", `Policy ${name} refused: ${await apiError(response)}`);
          return;
        }
        const set = await response.json();
        show("ok", `Policy ${set.target} set: at most ${set.concurrency} at once (${set.method}).`);
        changed();
      } catch (err) {
        show("error", `Could not reach the API: ${err.message}`);
      }
    });
  }

  document.addEventListener("click", async (event) => {
    const button = event.target.closest("button[data-policy-delete]");
    if (!button) return;
    const target = button.dataset.policyDelete;
    if (!window.confirm(button.dataset.confirm)) return;
    button.disabled = true;
    show("busy", `Deleting the policy for ${target}…`);
    try {
      const response = await call("DELETE", url(target));
      if (!response.ok) {
        show("error", `Deleting ${target} refused: ${await apiError(response)}`);
        return;
      }
      const deleted = await response.json();
      const restored = deleted.restored ? "; the action's own policy applies again" : "";
      show("ok", `Policy ${target} deleted; ${deleted.released} waiting execution(s) released${restored}.`);
      changed();
    } catch (err) {
      show("error", `Could not reach the API: ${err.message}`);
    } finally {
      button.disabled = false;
    }
  });
})();
