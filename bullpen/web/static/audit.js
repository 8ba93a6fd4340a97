// The audit log's filters and pages swap in place (htmx). A refused filter (422) is swapped in
// too, so its error shows where the list was, as it does without JavaScript.
(function () {
  "use strict";
  document.body.addEventListener("htmx:beforeSwap", function (e) {
    const target = e.detail.target;
    if (target && target.id === "audit-list" && e.detail.xhr.status === 422) {
      e.detail.shouldSwap = true;
      e.detail.isError = false;
    }
  });
})();
