"use strict";
// "Run on an event" on a target's page: posts the Transform box and the filters as
// edited (saved or not) and an event to the target's preview view, and shows what the program read
// and what the target would be sent. Nothing is sent to the target.
function csrfToken(form) {
  const field = form.querySelector("input[name=csrfmiddlewaretoken]");
  return field ? field.value : "";
}

function showRequest(answer) {
  if (answer.dropped) return "Dropped: " + answer.reason + ".\nNo attempt is made.";
  const lines = answer.headers.map(([name, value]) => name + ": " + value);
  const query = answer.query ? "?" + answer.query : "(none)";
  return "Query string: " + query + "\n" + lines.join("\n") + "\n\n" + answer.body;
}

async function runPreview(panel) {
  const form = panel.closest("form");
  const program = form.querySelector("textarea[name=transform]");
  const code = panel.querySelector(".wh-preview-code").value.trim();
  const body = new URLSearchParams({
    event: code || panel.querySelector(".wh-preview-event").value,
    transform: program ? program.value : "",
  });
  // The filters as edited too: a dropped event says which ran first.
  const filters = form.querySelector("textarea[name=filters]");
  if (filters) body.set("filters", filters.value);
  const status = panel.querySelector(".wh-preview-status");
  const input = panel.querySelector(".wh-preview-input");
  const output = panel.querySelector(".wh-preview-output");
  status.textContent = "Running…";
  const response = await fetch(panel.dataset.url, {
    method: "POST",
    body,
    headers: { "X-CSRFToken": csrfToken(form) },
    credentials: "same-origin",
  });
  const answer = await response.json();
  if (!response.ok) {
    status.textContent = answer.error;
    status.classList.add("wh-bad");
    output.textContent = "";
    return;
  }
  status.classList.remove("wh-bad");
  status.textContent = answer.output === null && !answer.dropped ? "No transform: the event as received." : "";
  input.textContent = JSON.stringify(answer.input, null, 2);
  output.textContent = showRequest(answer);
}

document.addEventListener("click", (event) => {
  const run = event.target.closest(".wh-preview-run");
  if (run) runPreview(run.closest(".wh-preview"));
});
