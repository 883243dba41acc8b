// Conveyor dashboard: what every script that calls the REST API shares (loaded first, from
// base.html). Each change goes to /api/v1, the verbs the CLI and SDK use, with the
// X-Conveyor-Dashboard header the API requires of a cookie-authenticated change; a refusal
// is shown with the API's own message. Text goes in with textContent, never as markup.
window.Conveyor = (() => {
  "use strict";
  const CSRF = { "X-Conveyor-Dashboard": "1" };

  function call(method, url, body) {
    const init = { method, headers: { ...CSRF } };
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    return fetch(url, init);
  }

  // The API's error message (or the start of what it answered), with the HTTP status.
  async function apiError(response) {
    let text = "";
    try {
      text = (await response.clone().json()).error;
    } catch {
      text = (await response.text()).slice(0, 300);
    }
    return `${text || response.statusText} (HTTP ${response.status})`;
  }

  function link(href, text) {
    const a = document.createElement("a");
    a.href = href;
    a.textContent = text;
    return a;
  }

  // Something changed: dashboard.js refreshes the live regions now.
  const changed = () => document.dispatchEvent(new Event("conveyor:changed"));

  return Object.freeze({ call, apiError, link, changed });
})();
