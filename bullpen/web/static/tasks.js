// Keeps the task list live: follows the workspace stream, updates each listed task's status
// as it changes and, on the unfiltered first page, adds new tasks at the top. The list may be
// replaced (filters, next page, by htmx), so it is looked up on every event. Text goes in as
// text, never HTML.
(function () {
  "use strict";
  const first = document.getElementById("tasks");
  if (!first) { return; }
  // From where the list was read: nothing that changed since then is missed.
  const source = new EventSource("/api/v1/events?after=" + encodeURIComponent(first.dataset.after));

  function statusBadge(value) {
    const badge = document.createElement("span");
    badge.className = "status status-" + value;
    badge.textContent = value;
    return badge;
  }

  function cell(row, child, className) {
    const td = row.insertCell();
    if (className) { td.className = className; }
    if (typeof child === "string") { td.textContent = child; } else { td.appendChild(child); }
    return td;
  }

  function addRow(table, change) {
    const body = table.tBodies[0];
    const empty = document.getElementById("no-tasks");
    if (empty) { empty.remove(); }
    const row = body.insertRow(0);
    row.dataset.taskId = change.task_id;
    cell(row, change.number, "number");
    const link = document.createElement("a");
    link.href = "/tasks/" + encodeURIComponent(change.task_id);
    link.textContent = change.title || "";
    cell(row, link);
    const agent = document.querySelector('select[name="agent"] option[value="' + CSS.escape(change.agent_id) + '"]');
    cell(row, agent ? agent.textContent : "");
    cell(row, statusBadge(change.status));
    cell(row, change.at.slice(0, 19).replace("T", " ") + " UTC");
    if (document.getElementById("bulk")) {
      const box = document.createElement("input");
      box.type = "checkbox";
      box.name = "task_id";
      box.value = change.task_id;
      box.setAttribute("form", "bulk");
      box.setAttribute("aria-label", "Select " + change.number);
      cell(row, box);
    }
    const limit = Number(table.dataset.limit);
    while (body.rows.length > limit) { body.deleteRow(body.rows.length - 1); }
  }

  source.addEventListener("task", function (e) {
    const change = JSON.parse(e.data);
    const table = document.getElementById("tasks");
    if (!table) { return; }
    const row = table.querySelector('tr[data-task-id="' + CSS.escape(change.task_id) + '"]');
    if (row) {
      row.querySelector(".status").replaceWith(statusBadge(change.status));
    } else if (change.previous === null && table.dataset.addNew === "true") {
      addRow(table, change); // a task created since the page was made
    }
  });
  source.addEventListener("open", function () { document.body.dataset.live = "true"; first.dataset.live = "true"; });
})();
