// Conveyor dashboard actions (issue #15): cancel, rerun, "retry failed", replay, purge,
// create and revoke tokens. Each calls the REST API (/api/v1, the verbs the CLI and SDK
// use) with the X-Conveyor-Dashboard header the API requires of a cookie-authenticated
// change; the server renders the buttons only for the roles the API accepts, and a
// refusal shows the API's own message. Text goes in with textContent, never as markup.
(() => {
  "use strict";
  const { call, apiError, link, changed } = window.Conveyor; // api.js
  const message = document.getElementById("action-message");

  function show(kind, ...parts) {
    if (!message) return;
    message.dataset.state = kind;
    message.replaceChildren(...parts);
  }

  // What an action's success says, from the API's answer.
  const done = {
    cancel: (id, body) => [`Execution ${id}: ${body.status}.`],
    rerun: (id, body) => {
      message.dataset.executionId = body.id;
      return [`Rerun of ${id}: `, link(`/executions/${body.id}`, `execution ${body.id}`), ` (${body.status}).`];
    },
    replay: (id, body) => [`Dead letter ${id}: ${body.resolution}.`],
    revoke: (id) => [`Token ${id} revoked.`],
  };

  // -- one button, one API call: <button data-api=URL data-kind=K [data-method] [data-confirm]>
  document.addEventListener("click", async (event) => {
    const button = event.target.closest("button[data-api]");
    if (!button || !message) return;
    const { api, kind, id, confirm: question, method = "POST" } = button.dataset;
    if (question && !window.confirm(question)) return;
    button.disabled = true;
    show("busy", `${kind} ${id}…`);
    try {
      const response = await call(method, api, method === "POST" ? {} : undefined);
      if (!response.ok) {
        show("error", `${kind} ${id} refused: ${await apiError(response)}`);
        return;
      }
      const body = response.status === 204 ? {} : await response.json();
      show("ok", ...done[kind](id, body));
      changed();
    } catch (err) {
      show("error", `Could not reach the API: ${err.message}`);
    } finally {
      button.disabled = false;
    }
  });

  // -- retry failed: the API's list of the failed executions matching the page's filters
  // (the newest data-limit of them), confirmed with their count, then one rerun each.
  const retry = document.getElementById("retry-failed");
  if (retry && message) {
    retry.addEventListener("click", async () => {
      retry.disabled = true;
      try {
        show("busy", "Looking for failed executions…");
        const listed = await fetch(`/api/v1/executions?${retry.dataset.query}`, { cache: "no-store" });
        if (!listed.ok) {
          show("error", `Listing refused: ${await apiError(listed)}`);
          return;
        }
        const page = await listed.json();
        const ids = page.items.map((item) => item.id);
        if (!ids.length) {
          show("ok", "No failed execution matches these filters.");
          return;
        }
        const more = page.next_cursor !== null ? " (the newest ones: more may match; run it again for the rest)" : "";
        if (!window.confirm(`Rerun ${ids.length} failed execution(s)${more}?`)) {
          show("ok", "Nothing rerun.");
          return;
        }
        const refused = [];
        let rerun = 0;
        for (const id of ids) {
          show("busy", `Rerunning ${rerun + refused.length + 1} of ${ids.length}…`);
          const response = await call("POST", `/api/v1/executions/${id}/rerun`, {});
          if (response.ok) rerun += 1;
          else refused.push(`${id}: ${await apiError(response)}`);
        }
        const tail = refused.length ? `; ${refused.length} refused (${refused[0]})` : "";
        show(refused.length ? "error" : "ok", `Reran ${rerun} of ${ids.length} failed execution(s)${tail}.`);
        changed();
      } catch (err) {
        show("error", `Could not reach the API: ${err.message}`);
      } finally {
        retry.disabled = false;
      }
    });
  }

  // -- purge dead letters with the form's filter (DELETE /api/v1/dead-letters?...)
  const purge = document.getElementById("purge-form");
  if (purge && message) {
    purge.addEventListener("submit", async (event) => {
      event.preventDefault();
      const query = new URLSearchParams();
      const { reason, resolution, older_than_hours: hours, include_pending: pending } = purge.elements;
      if (reason.value) query.set("reason", reason.value);
      if (resolution.value) query.set("resolution", resolution.value);
      if (hours.value !== "") query.set("older_than", String(Number(hours.value) * 3600));
      const what = [...query.entries()].map(([k, v]) => `${k} ${v}`).join(", ");
      if (!what) query.set("all", "true");
      if (pending.checked) query.set("include_pending", "true");
      const scope = pending.checked ? "every dead letter, pending ones included," : "every resolved dead letter";
      if (!window.confirm(`Delete ${scope} ${what ? `matching ${what}` : "(no filter)"}? This cannot be undone.`)) return;
      show("busy", "Purging…");
      try {
        const response = await call("DELETE", `/api/v1/dead-letters?${query}`);
        if (!response.ok) {
          show("error", `Purge refused: ${await apiError(response)}`);
          return;
        }
        show("ok", `Purged ${(await response.json()).deleted} dead letter(s).`);
        changed();
      } catch (err) {
        show("error", `Could not reach the API: ${err.message}`);
      }
    });
  }

  // -- create a token: its secret is in the API's answer only, shown here once.
  const tokenForm = document.getElementById("token-form");
  if (tokenForm && message) {
    const box = document.getElementById("token-created");
    const secret = document.getElementById("token-secret");
    tokenForm.addEventListener("submit", async (event) => {
      event.preventDefault();
      box.hidden = true;
      secret.textContent = "";
      show("busy", "Creating…");
      try {
        const body = { name: tokenForm.elements.name.value.trim(), role: tokenForm.elements.role.value };
        const response = await call("POST", "/api/v1/tokens", body);
        if (!response.ok) {
          show("error", `Refused: ${await apiError(response)}`);
          return;
        }
        const created = await response.json();
        secret.textContent = created.token;
        box.hidden = false;
        message.dataset.tokenId = created.id;
        show("ok", `Token ${created.id} (${created.name}, ${created.role}) created: copy it below, it is not shown again.`);
        tokenForm.reset();
        changed();
      } catch (err) {
        show("error", `Could not reach the API: ${err.message}`);
      }
    });
    document.getElementById("token-copy").addEventListener("click", async () => {
      try {
        await navigator.clipboard.writeText(secret.textContent);
        show("ok", "Copied to the clipboard.");
      } catch {
        window.getSelection().selectAllChildren(secret); // no clipboard access: select it for Ctrl+C
        show("ok", "Selected: press Ctrl+C (or ⌘C) to copy.");
      }
    });
  }
})();
