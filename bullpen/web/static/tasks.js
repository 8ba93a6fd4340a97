// Keeps the dashboard's task list live: follows the workspace stream, updates each listed
// task's status as it changes and adds new tasks at the top. Text goes in as text, never HTML.
(function () {
  "use strict";
  const table = document.getElementById("tasks");
  const body = table.tBodies[0];
  const limit = Number(table.dataset.limit);
  // From where the list was read: nothing that changed since then is missed.
  const source = new EventSource("/api/v1/events?after=" + encodeURIComponent(table.dataset.after));

  function statusBadge(value) {
    const badge = document.createElement("span");
    badge.className = "status status-" + value;
    badge.textContent = value;
    return badge;
  }

  function cell(row, child) {
    const td = row.insertCell();
    if (typeof child === "string") { td.textContent = child; } else { td.appendChild(child); }
    return td;
  }

  function addRow(change) {
    const empty = document.getElementById("no-tasks");
    if (empty) { empty.remove(); }
    const row = body.insertRow(0);
    row.dataset.taskId = change.task_id;
    cell(row, change.number);
    const link = document.createElement("a");
    link.href = "/tasks/" + encodeURIComponent(change.task_id);
    link.textContent = change.title || "";
    cell(row, link);
    cell(row, statusBadge(change.status));
    cell(row, change.at.slice(0, 19).replace("T", " ") + " UTC");
    while (body.rows.length > limit) { body.deleteRow(body.rows.length - 1); }
  }

  source.addEventListener("task", function (e) {
    const change = JSON.parse(e.data);
    const row = body.querySelector('tr[data-task-id="' + CSS.escape(change.task_id) + '"]');
    if (row) {
      row.cells[2].replaceChildren(statusBadge(change.status));
    } else if (change.previous === null) {
      addRow(change); // a task created since the page was made
    }
  });
  source.addEventListener("open", function () { table.dataset.live = "true"; });
})();
