// The calls of a session waiting for approval, each with Approve and Deny (deny asks for an
// optional reason first).
//
// The list is kept by call id across refreshes: an item stays as it is (a reason being typed
// survives) while the detail still lists its call, and goes once the call is decided. A refused
// decision (409 NOT_AWAITING_APPROVAL, 401, ...) is shown in the item itself.

import { errorText } from "./api.js";
import { el, prettyJson, showError } from "./dom.js";

/** Longest reason the deny box takes (the server limits it too). */
const MAX_REASON = 10000;

export class PendingList {
  /** `decide(callId, decision, message)` posts the decision and resolves to its JSON answer. */
  constructor(section, list, decide) {
    this.section = section;
    this.list = list;
    this.decide = decide;
    this.items = new Map();
  }

  clear() {
    this.items.clear();
    this.list.replaceChildren();
    this.section.hidden = true;
  }

  /** Show exactly the calls of `pending` (the detail's `pending`). */
  render(pending) {
    const live = new Set(pending.map((p) => p.call_id));
    for (const [callId, item] of this.items) {
      if (!live.has(callId)) {
        item.remove();
        this.items.delete(callId);
      }
    }
    for (const p of pending) {
      if (this.items.has(p.call_id)) continue;
      const item = this.item(p);
      this.items.set(p.call_id, item);
      this.list.append(item);
    }
    this.section.hidden = this.items.size === 0;
  }

  item(p) {
    const error = el("p", { class: "error", role: "alert", "data-testid": "pending-error", hidden: true });
    const reason = el("input", {
      type: "text",
      maxlength: MAX_REASON,
      placeholder: "reason (optional)",
      "aria-label": `Reason to deny ${p.name} (optional)`,
      "data-testid": "deny-message",
    });
    const denyForm = el(
      "form",
      { class: "deny-form", hidden: true, "data-testid": "deny-form" },
      reason,
      el("button", { type: "submit", class: "danger", "data-testid": "deny-confirm" }, "Deny call"),
    );
    const item = el(
      "li",
      { class: "pending-item", "data-testid": "pending-item", "data-call-id": p.call_id },
      el(
        "div",
        {},
        el("strong", { "data-testid": "pending-name" }, p.name),
        " ",
        el("code", {}, p.call_id),
        p.turn ? ` (turn ${p.turn})` : "",
      ),
      el("pre", { class: "json", "data-testid": "pending-args" }, prettyJson(p.arguments)),
      el(
        "div",
        { class: "row" },
        button("Approve", "approve", `Approve ${p.name} ${p.call_id}`, () => {
          this.send(item, p, "approve", null);
        }),
        button("Deny…", "deny", `Deny ${p.name} ${p.call_id}`, () => {
          denyForm.hidden = false;
          reason.focus();
        }),
      ),
      denyForm,
      error,
    );
    denyForm.addEventListener("submit", (event) => {
      event.preventDefault();
      this.send(item, p, "deny", reason.value.trim() || null);
    });
    return item;
  }

  async send(item, p, decision, message) {
    const error = item.querySelector("[data-testid=pending-error]");
    const buttons = item.querySelectorAll("button");
    buttons.forEach((b) => (b.disabled = true));
    try {
      const result = await this.decide(p.call_id, decision, message);
      showError(error, "");
      item.dataset.decided = decision;
      if (!result.applied) {
        const note = "Decision queued: no worker holds this session yet.";
        item.append(el("p", { class: "muted", "data-testid": "pending-queued" }, note));
      }
    } catch (err) {
      showError(error, errorText(err));
      buttons.forEach((b) => (b.disabled = false));
    }
  }
}

function button(text, testid, label, onclick) {
  const cls = testid === "deny" ? "danger" : null;
  const attrs = { type: "button", class: cls, "aria-label": label, "data-testid": testid, onclick };
  return el("button", attrs, text);
}
