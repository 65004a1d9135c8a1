"use strict";
// Copy buttons beside inbound URLs, and per-type target fields.
document.addEventListener("click", (event) => {
  const button = event.target.closest(".wh-copy[data-copy]");
  if (!button) return;
  navigator.clipboard.writeText(button.dataset.copy).then(() => {
    button.textContent = "Copied";
    setTimeout(() => { button.textContent = "Copy"; }, 1500);
  });
});

function showTypeFields(select) {
  // A target in the webhook's inline (unfold's .form-group, Django's
  // .inline-related), or alone on its own page.
  const form = select.closest(".form-group, .inline-related") || select.form;
  if (!form) return;
  for (const box of form.querySelectorAll("[class*='wh-type-']")) {
    box.style.display = box.classList.contains("wh-type-" + select.value) ? "" : "none";
  }
}

document.addEventListener("change", (event) => {
  if (event.target.matches("select[data-target-type]")) showTypeFields(event.target);
});
document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll("select[data-target-type]").forEach(showTypeFields);
});
document.addEventListener("formset:added", (event) => {
  event.target.querySelectorAll("select[data-target-type]").forEach(showTypeFields);
});

// The dashboard refreshes its figures in place every WEBHOOKER_CONSOLE_REFRESH
// seconds (data-refresh, in ms; no full reload), and pauses while the tab is hidden.

async function refreshDashboard() {
  const current = document.getElementById("wh-dashboard");
  if (!current || document.hidden) return;
  try {
    const response = await fetch(current.dataset.live, {credentials: "same-origin"});
    if (!response.ok) return;
    const holder = document.createElement("div");
    holder.innerHTML = await response.text();
    const fresh = holder.querySelector("#wh-dashboard");
    if (fresh) current.replaceWith(fresh);
  } catch (error) {
    // Offline for a moment: the next round tries again.
  }
}

document.addEventListener("DOMContentLoaded", () => {
  const dashboard = document.getElementById("wh-dashboard");
  if (dashboard) setInterval(refreshDashboard, Number(dashboard.dataset.refresh) || 5000);
});

// The hourly chart's figures on hover (and on tap, on phones).
let tooltip = null;
function showTip(event) {
  const bar = event.target.closest(".wh-bar");
  if (!bar) {
    if (tooltip) tooltip.remove();
    tooltip = null;
    return;
  }
  if (!tooltip) {
    tooltip = document.createElement("div");
    tooltip.className = "wh-tooltip";
    document.body.appendChild(tooltip);
  }
  tooltip.textContent = bar.dataset.tip;
  tooltip.style.left = `${event.pageX + 12}px`;
  tooltip.style.top = `${event.pageY - 28}px`;
}
document.addEventListener("mousemove", showTip);
document.addEventListener("click", showTip);
