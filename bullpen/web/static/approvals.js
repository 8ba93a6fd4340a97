// Keeps the approvals inbox live: an approval requested or decided anywhere in the workspace
// re-reads the list (htmx swaps it in place; a form being filled in is not disturbed).
(function () {
  "use strict";
  const list = document.getElementById("approval-list");
  const source = new EventSource("/api/v1/events?after=" + encodeURIComponent(list.dataset.after));
  function refresh() {
    const current = document.getElementById("approval-list");
    const busy = current.contains(document.activeElement) && document.activeElement.name === "reason" && document.activeElement.value;
    if (!busy && window.htmx) { window.htmx.trigger(current, "refresh"); }
  }
  source.addEventListener("approval.requested", refresh);
  source.addEventListener("approval.decided", refresh);
  source.addEventListener("open", function () { document.body.dataset.live = "true"; });
})();
