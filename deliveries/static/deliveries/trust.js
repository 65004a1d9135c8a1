"use strict";
// Signing secrets shown masked until revealed; "Rotate secret" asks first; the
// entrypoint form shows the fields of the verification preset chosen.
document.addEventListener("click", (event) => {
  const reveal = event.target.closest(".wh-reveal");
  if (reveal) {
    const secret = document.getElementById(reveal.dataset.for);
    const shown = secret.textContent === secret.dataset.secret;
    secret.textContent = shown ? secret.dataset.masked : secret.dataset.secret;
    reveal.textContent = shown ? "Reveal" : "Hide";
    return;
  }
  const rotate = event.target.closest(".wh-rotate");
  if (rotate && !window.confirm(rotate.dataset.confirm)) event.preventDefault();
});

function showPresetFields(select) {
  const used = JSON.parse(select.dataset.presetKeys)[select.value] || [];
  for (const key of JSON.parse(select.dataset.allKeys)) {
    const row = select.form.querySelector(".field-" + key);
    if (row) row.style.display = used.includes(key) ? "" : "none";
  }
}

document.addEventListener("change", (event) => {
  if (event.target.matches("select[data-preset-keys]")) showPresetFields(event.target);
});
document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll("select[data-preset-keys]").forEach(showPresetFields);
});
