"use strict";
// A target's filters edited as rows (source, name, operator, value) instead of a
// JSON text box, with "deliver only these event types" from the types the webhook
// has seen. The rows write the JSON back into the form's own field, which the
// server validates as before; without this script the JSON box is shown as it is.
const SOURCES = { header: "Header", json: "JSON path", event: "Event" };
const OPS = { equals: "equals", one_of: "is one of", exists: "exists", not_equals: "does not equal" };

function element(tag, attrs = {}, children = []) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "text") node.textContent = value;
    else node.setAttribute(key, value);
  }
  children.forEach((child) => node.appendChild(child));
  return node;
}

function choice(options, selected, label) {
  const select = element("select", { "aria-label": label, class: "border border-base-200 rounded-default px-2 py-1" });
  for (const [value, text] of Object.entries(options)) {
    const option = element("option", { value, text });
    option.selected = value === selected;
    select.appendChild(option);
  }
  return select;
}

function shownValue(rule) {
  if (rule.value === undefined) return "";
  const values = rule.op === "one_of" ? rule.value : [rule.value];
  return values.map((v) => (typeof v === "string" ? v : JSON.stringify(v))).join(", ");
}

function typedValue(source, text) {
  // A JSON rule compares JSON values: 3, true and null are not strings.
  if (source !== "json") return text;
  try {
    return JSON.parse(text);
  } catch (error) {
    return text;
  }
}

function ruleOf(row) {
  const [source, name, op, value] = row.querySelectorAll("select, input");
  const rule = { source: source.value, name: name.value.trim(), op: op.value };
  if (op.value === "exists") return rule;
  const parts = op.value === "one_of" ? value.value.split(",") : [value.value];
  const values = parts.map((part) => typedValue(source.value, part.trim()));
  rule.value = op.value === "one_of" ? values.filter((v) => v !== "") : values[0];
  return rule;
}

function ruleRow(editor, rule) {
  const source = choice(SOURCES, rule.source || "header", "Source");
  const name = element("input", { type: "text", "aria-label": "Name", placeholder: "X-GitHub-Event, data.object.status or type", class: "border border-base-200 rounded-default px-2 py-1" });
  name.value = rule.name || (rule.source === "event" ? "type" : "");
  const op = choice(OPS, rule.op || "equals", "Operator");
  const value = element("input", { type: "text", "aria-label": "Value", class: "border border-base-200 rounded-default px-2 py-1" });
  value.value = shownValue(rule);
  const remove = element("button", { type: "button", class: "wh-button", text: "Remove" });
  const row = element("div", { class: "wh-filter-row" }, [source, name, op, value, remove]);
  const sync = () => {
    value.disabled = op.value === "exists";
    editor.save();
  };
  row.addEventListener("input", sync);
  row.addEventListener("change", sync);
  remove.addEventListener("click", () => {
    row.remove();
    editor.save();
  });
  value.disabled = op.value === "exists";
  return row;
}

function typesShortcut(editor, types) {
  if (!types.length) return null;
  const boxes = types.map((type) => {
    const box = element("input", { type: "checkbox", value: type });
    return element("label", { class: "wh-filter-type" }, [box, document.createTextNode(" " + type)]);
  });
  const apply = element("button", { type: "button", class: "wh-button", text: "Deliver only these event types" });
  apply.addEventListener("click", () => {
    const chosen = boxes.map((label) => label.firstChild).filter((box) => box.checked).map((box) => box.value);
    editor.rows.querySelectorAll(".wh-filter-row").forEach((row) => {
      const rule = ruleOf(row);
      if (rule.source === "event" && rule.name === "type") row.remove();
    });
    if (chosen.length) editor.rows.appendChild(ruleRow(editor, { source: "event", name: "type", op: "one_of", value: chosen }));
    editor.save();
  });
  return element("div", { class: "wh-filter-types" }, [...boxes, apply]);
}

function filterEditor(textarea) {
  let rules;
  try {
    rules = JSON.parse(textarea.value || "[]");
  } catch (error) {
    return; // not JSON (a form sent back with an error): leave the box as it is
  }
  if (!Array.isArray(rules)) return;
  const editor = { rows: element("div", { class: "wh-filter-rows" }) };
  editor.save = () => {
    const all = [...editor.rows.querySelectorAll(".wh-filter-row")].map(ruleOf);
    textarea.value = JSON.stringify(all, null, 2);
  };
  rules.forEach((rule) => editor.rows.appendChild(ruleRow(editor, rule)));
  const add = element("button", { type: "button", class: "wh-button", text: "Add a rule" });
  add.addEventListener("click", () => {
    editor.rows.appendChild(ruleRow(editor, {}));
    editor.save();
  });
  const types = JSON.parse(textarea.dataset.eventTypes || "[]");
  const parts = [editor.rows, add];
  const shortcut = typesShortcut(editor, types);
  if (shortcut) parts.push(shortcut);
  textarea.hidden = true;
  textarea.after(element("div", { class: "wh-filter-editor" }, parts));
}

document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll("textarea[data-filter-rows]").forEach(filterEditor);
});
// A target added on its webhook's page ("Add another").
document.addEventListener("formset:added", (event) => {
  event.target.querySelectorAll("textarea[data-filter-rows]").forEach(filterEditor);
});
