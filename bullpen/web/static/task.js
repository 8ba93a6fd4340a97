// Follows a task's event stream and renders tokens as they arrive.
(function () {
  "use strict";
  const article = document.getElementById("task");
  const output = document.getElementById("output");
  const statusEl = document.getElementById("status");
  const errorEl = document.getElementById("error");
  const source = new EventSource("/api/v1/tasks/" + article.dataset.taskId + "/events");

  function setStatus(value) {
    statusEl.textContent = value;
    statusEl.className = "status status-" + value;
  }
  source.addEventListener("status", function (e) { setStatus(JSON.parse(e.data).status); });
  source.addEventListener("text", function (e) { output.textContent += JSON.parse(e.data).text; });
  source.addEventListener("error", function (e) {
    if (!e.data) { return; } // a connection error: EventSource reconnects with Last-Event-ID
    errorEl.textContent = JSON.parse(e.data).message;
    errorEl.hidden = false;
  });
  // Each run of the task (a retry is a new run) starts afresh.
  source.addEventListener("run", function () {
    output.textContent = "";
    errorEl.textContent = "";
    errorEl.hidden = true;
  });
  source.addEventListener("end", function (e) { setStatus(JSON.parse(e.data).status); });
  // The task has finished: nothing more will come.
  source.addEventListener("close", function () {
    article.dataset.ended = "true";
    source.close();
  });
})();
