// The new API key's Copy button: without JavaScript the key is a read-only field whose text
// is selected and copied by hand; with it, one click copies it and says so.
(function () {
  "use strict";
  document.querySelectorAll("button[data-copy]").forEach(function (button) {
    const field = document.getElementById(button.dataset.copy);
    const status = document.getElementById("copy-status");
    if (!field) { return; }
    button.hidden = false;
    button.addEventListener("click", function () {
      field.select();
      const done = function () { if (status) { status.textContent = "Copied."; } };
      const manual = function () { if (status) { status.textContent = "Press Ctrl+C (Cmd+C on a Mac) to copy the selected key."; } };
      if (navigator.clipboard && window.isSecureContext) {
        navigator.clipboard.writeText(field.value).then(done, manual);
      } else {
        manual();
      }
    });
  });
  document.querySelectorAll("input.secret").forEach(function (field) {
    field.addEventListener("focus", function () { field.select(); });
  });
})();
