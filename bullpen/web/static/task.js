// A task's page: follows the task's event stream and renders tokens as they arrive
// (EventSource resumes with Last-Event-ID after a drop: nothing lost, nothing repeated), and
// the workspace stream for its subtask tree. When a run ends the timeline is re-read (htmx).
(function () {
  "use strict";
  const article = document.getElementById("task");
  const output = document.getElementById("output");
  const statusEl = document.getElementById("status");
  const errorEl = document.getElementById("error");
  const taskId = article.dataset.taskId;
  const source = new EventSource("/api/v1/tasks/" + taskId + "/events");

  function setStatus(value) {
    statusEl.textContent = value;
    statusEl.className = "status status-" + value;
  }
  function refreshTimeline() {
    if (window.htmx) {
      window.htmx.ajax("GET", window.location.pathname, {target: "#timeline", select: "#timeline", swap: "outerHTML"});
    }
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
  source.addEventListener("end", function (e) {
    setStatus(JSON.parse(e.data).status);
    refreshTimeline();
  });
  // The task has finished: nothing more will come.
  source.addEventListener("close", function () {
    article.dataset.ended = "true";
    source.close();
  });

  // The subtask tree: a change whose parent is this task or a task already in the tree.
  const tree = document.getElementById("subtasks");
  const none = document.getElementById("no-subtasks");
  const nodes = new Map([[taskId, tree]]);
  tree.querySelectorAll("li[data-task-id]").forEach(function (li) { nodes.set(li.dataset.taskId, li.querySelector("ul")); });

  function badge(value) {
    const span = document.createElement("span");
    span.className = "status status-" + value;
    span.textContent = value;
    return span;
  }
  const changes = new EventSource("/api/v1/events?after=" + encodeURIComponent(article.dataset.after));
  changes.addEventListener("task", function (e) {
    const change = JSON.parse(e.data);
    const known = tree.querySelector('li[data-task-id="' + CSS.escape(change.task_id) + '"]');
    if (known) {
      known.querySelector(":scope > .status").replaceWith(badge(change.status));
      return;
    }
    const under = change.parent_id && nodes.get(change.parent_id);
    if (!under) { return; }
    const li = document.createElement("li");
    li.dataset.taskId = change.task_id;
    const link = document.createElement("a");
    link.href = "/tasks/" + encodeURIComponent(change.task_id);
    link.textContent = change.number + " " + (change.title || "");
    li.append(link, " ", badge(change.status));
    const children = document.createElement("ul");
    li.appendChild(children);
    under.appendChild(li);
    nodes.set(change.task_id, children);
    none.hidden = true;
  });
  changes.addEventListener("open", function () { tree.dataset.live = "true"; });
})();
