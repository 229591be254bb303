// Live updates of an inbox page (docs/approvals.md): the server tells this page, by server-sent events, when
// the previews its person may decide change; the page then fetches itself again and swaps its live region in.
// Without JavaScript the inbox reloads itself every data-reload seconds instead (a <noscript> refresh).
"use strict";
(function () {
  // The expiry of each preview shown counts down (the server's wording; seconds in the last minute).
  function left(seconds) {
    const minutes = Math.floor(seconds / 60), hours = Math.floor(minutes / 60);
    if (hours) { return hours + " h " + (minutes % 60) + " min left"; }
    return minutes ? minutes + " min left" : Math.floor(seconds) + " s left";
  }
  function tick() {
    for (const shown of document.querySelectorAll("[data-expires-at]")) {
      const seconds = (Date.parse(shown.dataset.expiresAt) - Date.now()) / 1000;
      const text = seconds > 0 ? left(seconds) : "expired";
      if (shown.textContent !== text) { shown.textContent = text; }
    }
  }
  tick();
  window.setInterval(tick, 1000);

  const region = document.getElementById("live-region");
  const status = document.getElementById("live-status");
  if (!region || !region.dataset.live || !window.EventSource) {
    return;
  }
  const say = (text) => { if (status) { status.textContent = text; } };
  const source = new EventSource(region.dataset.live);
  let current = region;

  async function refresh() {
    const response = await fetch(window.location.href, { credentials: "same-origin", cache: "no-store" });
    if (!response.ok || response.redirected) {
      say("The page could not be updated; reload it.");
      return;
    }
    const page = new DOMParser().parseFromString(await response.text(), "text/html");
    const fresh = page.getElementById("live-region");
    if (!fresh || (current.dataset.state !== undefined && fresh.dataset.state === current.dataset.state)) {
      return; // a preview's page changes only when that preview's state does: a comment being typed stays
    }
    const focused = current.contains(document.activeElement) ? document.activeElement.getAttribute("href") : null;
    current.replaceWith(fresh);
    current = fresh;
    if (focused) {
      const again = Array.from(fresh.querySelectorAll("a[href]")).find((link) => link.getAttribute("href") === focused);
      if (again) { again.focus(); }
    }
    say("Updated at " + new Date().toLocaleTimeString() + ".");
  }

  source.addEventListener("changed", () => { refresh().catch(() => say("The page could not be updated; reload it.")); });
  source.addEventListener("signed-out", () => {
    source.close();
    say("Your session ended: reload the page to sign in again.");
  });
  // A newer page of this person took this one's stream, or the inbox holds as many as it may (refused, 503):
  // the page then reloads its list every data-reload seconds (the server's Retry-After), as it does without JavaScript.
  const reload = Number(region.dataset.reload);
  function polling() {
    source.close();
    say("Live updates are paused here; this page reloads every " + reload + " seconds.");
    window.setInterval(() => { refresh().catch(() => say("The page could not be updated; reload it.")); }, reload * 1000);
  }
  source.addEventListener("superseded", polling);
  source.addEventListener("error", () => { if (source.readyState === EventSource.CLOSED) { polling(); } });
})();
