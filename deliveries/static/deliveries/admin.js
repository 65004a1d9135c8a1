"use strict";
// Copy buttons beside inbound URLs, and per-type target fields.
document.addEventListener("click", (event) => {
  const button = event.target.closest(".wh-copy");
  if (!button) return;
  navigator.clipboard.writeText(button.dataset.copy).then(() => {
    button.textContent = "Copied";
    setTimeout(() => { button.textContent = "Copy"; }, 1500);
  });
});

function showTypeFields(select) {
  // A target in the webhook's inline, or alone on its own page.
  const form = select.closest(".inline-related") || select.form;
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
