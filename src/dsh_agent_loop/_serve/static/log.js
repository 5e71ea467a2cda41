// The log renderer: a session's durable events, in seq order, as turns → steps → what happened.
//
// Events are appended one by one (the initial pages, then the live stream), each at most once:
// add() drops a seq it has seen, so a stream reconnect that repeats events changes nothing. An
// event lands where it happened: in the open step, else the open turn, else between turns (an
// approval decided while the session waited). Tool calls are cards keyed by call id; a result in
// the same turn fills its card, a result in a later turn (after an approval) stands at its own
// place and names its call. Compactions and surface replacements are marked in place. Token
// usage per model call feeds an inline SVG bar chart. All text is inserted as text (dom.js).

import { clipped, el, num, prettyJson, svg } from "./dom.js";

/** Event types that only steer the log's structure or the request and show nothing of their own. */
const SILENT = new Set(["request/header", "request/context", "agent/inbox/spliced", "step/end"]);

/** What a replacement dims: the model-facing messages in its range (and their tool calls). */
const DIMMED = [
  "user-message",
  "user-runtime-context",
  "user-compaction",
  "system-message",
  "reasoning",
  "assistant-text",
  "tool-call",
  "tool-result",
]
  .map((testid) => `[data-testid="${testid}"][data-seq]`)
  .join(", ");

/** Model calls the chart shows (the latest); the totals count every call. */
const CHART_MAX_BARS = 120;

export class LogRenderer {
  constructor(root, chart, totals) {
    this.root = root;
    this.chart = chart;
    this.totals = totals;
    this.reset();
  }

  reset() {
    this.lastSeq = -1;
    this.turn = null; // {number, section, body}
    this.step = null; // {number, body}
    this.calls = new Map(); // call_id -> {slot, turn, name}: where its result and marks go
    this.usage = []; // {turn, step, input, output}
    this.chartQueued = false;
    this.root.replaceChildren();
    this.drawChart();
  }

  /** Append `event` if its seq is new; return whether it was. */
  add(event) {
    if (typeof event.seq !== "number" || event.seq <= this.lastSeq) return false;
    this.lastSeq = event.seq;
    if (isReplacement(event)) this.replaced(event);
    const handler = HANDLERS[event.type];
    if (handler) handler.call(this, event, event.data || {});
    else if (!SILENT.has(event.type)) this.place(line(event, "other", event.type));
    return true;
  }

  /** Mark the replacement where it happened, and dim what it replaced (still shown). */
  replaced(event) {
    const { start_seq: start, end_seq: end } = event.surface_op;
    const text = `${event.type} at seq ${event.seq} replaces events ${start}–${end}`;
    this.place(line(event, "replacement", text));
    for (const node of this.root.querySelectorAll(DIMMED)) {
      const seq = Number(node.dataset.seq);
      if (seq >= start && seq <= end && !node.classList.contains("replaced")) {
        node.classList.add("replaced");
        node.title = `replaced by seq ${event.seq}`;
      }
    }
  }

  place(node) {
    (this.step?.body ?? this.turn?.body ?? this.root).append(node);
  }

  turnStart(event, data) {
    const body = el("div", { class: "turn-body" });
    const section = el(
      "section",
      { class: "turn", "data-testid": "turn", "data-turn": data.turn, "data-seq": event.seq },
      el("h3", {}, `Turn ${data.turn}`),
      body,
    );
    this.root.append(section);
    this.turn = { number: data.turn, section, body };
    this.step = null;
  }

  turnEnd(event, data) {
    const reason = data.reason || {};
    const node = line(event, "turn-end", `Turn ${data.turn} ended: ${reasonText(reason)}`);
    node.classList.add(`reason-${reason.kind}`);
    node.dataset.reason = reason.kind;
    this.step = null;
    this.place(node);
    this.turn?.section.classList.add("ended", `reason-${reason.kind}`);
    this.turn = null;
  }

  stepStart(event, data) {
    const body = el("div", { class: "step-body" });
    const usage = el("span", { class: "step-usage", "data-testid": "step-usage" });
    const node = el(
      "div",
      { class: "step", "data-testid": "step", "data-step": data.step, "data-seq": event.seq },
      el("h4", {}, `Step ${data.step} `, usage),
      body,
    );
    (this.turn?.body ?? this.root).append(node);
    this.step = { number: data.step, body, usage };
  }

  userMessage(event, data) {
    const message = data.message || {};
    const text = blocksText(message.content);
    const source = message.source;
    if (source === "runtime-context" || source === "compaction") {
      const label = source === "compaction" ? "Summary of earlier context" : "Runtime context";
      this.place(folded(event, `user-${source}`, label, text));
      return;
    }
    const label = source === "tool-result" ? "From a tool result" : "User";
    this.place(
      el(
        "div",
        { class: "msg user", "data-testid": "user-message", "data-seq": event.seq },
        el("span", { class: "who" }, label),
        el("div", { class: "text" }, clipped(text)),
      ),
    );
  }

  assistantMessage(event, data) {
    const content = data.message?.content || [];
    for (const block of content) {
      if (block.type === "reasoning") this.place(folded(event, "reasoning", "Reasoning", block.text));
      else if (block.type === "text") this.place(assistantText(event, block.text));
    }
    if (!content.some((b) => b.type === "text" || b.type === "reasoning" || b.type === "tool-call")) {
      this.place(line(event, "assistant-empty", "(the model answered with no content)"));
    }
    if (data.interrupted) {
      this.place(line(event, "interrupted", "interrupted: only what was delivered is kept"));
    }
    if (data.usage) this.addUsage(data);
  }

  addUsage(data) {
    const input = Number(data.usage.input_tokens ?? 0);
    const output = Number(data.usage.output_tokens ?? 0);
    this.usage.push({ turn: data.turn, step: data.step, input, output });
    if (this.step) this.step.usage.textContent = `· in ${num(input)} · out ${num(output)} tokens`;
    this.queueChart();
  }

  toolCall(event, data) {
    const slot = el("div", { class: "tool-slot" });
    const card = el(
      "div",
      { class: "tool-call", "data-testid": "tool-call", "data-seq": event.seq },
      el(
        "div",
        { class: "tool-head" },
        el("span", { class: "tool-name", "data-testid": "tool-name" }, data.name),
        el("code", { class: "call-id" }, data.call_id),
      ),
      el("pre", { class: "json", "data-testid": "tool-args" }, clipped(prettyJson(data.arguments))),
      slot,
    );
    card.dataset.callId = data.call_id;
    card.dataset.toolName = data.name;
    this.calls.set(data.call_id, { slot, turn: this.turn?.number, name: data.name });
    this.place(card);
  }

  approvalRequested(event, data) {
    const call = this.calls.get(data.call_id);
    if (call) call.slot.append(line(event, "approval-requested", "waiting for approval"));
    else this.place(line(event, "approval-requested", `${data.name} (${data.call_id}) waits for approval`));
  }

  approval(event, data) {
    const verb = data.decision === "approve" ? "approved" : "denied";
    const name = this.calls.get(data.call_id)?.name ?? "call";
    const extra = data.message ? `: ${data.message}` : "";
    const node = line(event, "approval-decision", `${verb} ${name} (${data.call_id})${extra}`);
    node.dataset.decision = data.decision;
    this.place(node);
    this.calls.get(data.call_id)?.slot.append(line(event, "approval-mark", verb));
  }

  toolResult(event, data) {
    const message = data.message || {};
    const callId = message.call_id;
    const call = this.calls.get(callId);
    const here = call && call.turn === this.turn?.number;
    const code = data.error?.code;
    const isError = Boolean(code) || (message.content || []).some((b) => b.is_error);
    const node = el(
      "div",
      { class: isError ? "tool-result is-error" : "tool-result", "data-testid": "tool-result" },
      el(
        "div",
        { class: "tool-head" },
        here ? "result" : `result of ${message.name ?? call?.name ?? "call"} (${callId})`,
        code ? el("span", { class: "error-code", "data-testid": "tool-error-code" }, code) : null,
      ),
      el("pre", { "data-testid": "tool-result-text" }, clipped(blocksText(message.content, "tool-result"))),
    );
    node.dataset.callId = callId;
    node.dataset.seq = event.seq;
    if (here) call.slot.append(node);
    else this.place(node);
  }

  compaction(event, data) {
    const span = `events ${data.start_seq}–${data.end_seq}`;
    const text = data.failure
      ? `Compaction failed (${data.failure.code}): ${data.failure.message}; nothing was replaced`
      : `Context compacted: ${span} replaced by the summary at seq ${data.summary_seq}; ` +
        `about ${num(data.tokens_before)} → ${num(data.tokens_after)} input tokens`;
    this.place(line(event, "compaction", text));
  }

  attemptFailed(event, data) {
    const failure = data.failure || {};
    const attempt = data.stream?.attempt ?? "?";
    const text = `attempt ${attempt} failed: ${failure.code} ${failure.message ?? ""}`;
    this.place(line(event, "attempt-failure", text));
  }

  systemMessage(event, data) {
    const text = blocksText(data.message?.content);
    if (text) this.place(folded(event, "system-message", "System prompt", text));
  }

  endSeed(event, data) {
    if (data.inherited) this.place(line(event, "fork-point", "everything above came from the fork source"));
  }

  permissionsAllowed(event, data) {
    this.place(line(event, "permission-allowed", `always allowed from now on: ${data.rule}`));
  }

  queueChart() {
    if (this.chartQueued) return;
    this.chartQueued = true;
    requestAnimationFrame(() => {
      this.chartQueued = false;
      this.drawChart();
    });
  }

  drawChart() {
    const input = this.usage.reduce((sum, u) => sum + u.input, 0);
    const output = this.usage.reduce((sum, u) => sum + u.output, 0);
    this.totals.textContent =
      `${num(input + output)} tokens: ${num(input)} input, ${num(output)} output, ` +
      `over ${this.usage.length} model call${this.usage.length === 1 ? "" : "s"}`;
    this.chart.replaceChildren(this.usage.length ? barChart(this.usage.slice(-CHART_MAX_BARS)) : "");
  }
}

const HANDLERS = {
  "turn/start": LogRenderer.prototype.turnStart,
  "turn/end": LogRenderer.prototype.turnEnd,
  "step/start": LogRenderer.prototype.stepStart,
  "user/message": LogRenderer.prototype.userMessage,
  "assistant/message": LogRenderer.prototype.assistantMessage,
  "tool/call": LogRenderer.prototype.toolCall,
  "tool/approval-requested": LogRenderer.prototype.approvalRequested,
  "tool/approval": LogRenderer.prototype.approval,
  "tool/result": LogRenderer.prototype.toolResult,
  "context/compaction": LogRenderer.prototype.compaction,
  "assistant/attempt": LogRenderer.prototype.attemptFailed,
  "system/message": LogRenderer.prototype.systemMessage,
  "session/end-seed": LogRenderer.prototype.endSeed,
  "permissions/allowed": LogRenderer.prototype.permissionsAllowed,
};

function isReplacement(event) {
  return typeof event.surface_op === "object" && event.surface_op?.op === "replace";
}

/** The text of a message's content blocks of `type` (text blocks by default), joined. */
function blocksText(content, type = "text") {
  if (typeof content === "string") return content;
  return (content || [])
    .filter((b) => b && b.type === type)
    .map((b) => String(b.text ?? ""))
    .join("\n");
}

function line(event, kind, text) {
  return el("div", { class: `line ${kind}`, "data-testid": kind, "data-seq": event.seq }, text);
}

function folded(event, kind, label, text) {
  return el(
    "details",
    { class: `folded ${kind}`, "data-testid": kind, "data-seq": event.seq },
    el("summary", {}, label),
    el("pre", {}, clipped(text)),
  );
}

function assistantText(event, text) {
  return el(
    "div",
    { class: "msg assistant", "data-testid": "assistant-text", "data-seq": event.seq },
    el("span", { class: "who" }, "Assistant"),
    el("div", { class: "text" }, clipped(text)),
  );
}

function reasonText(reason) {
  switch (reason.kind) {
    case "aborted":
      return `aborted (${reason.cause ?? "?"})${reason.message ? `: ${reason.message}` : ""}`;
    case "error":
      return `error ${reason.error?.code ?? ""}: ${reason.error?.message ?? ""}`;
    case "awaiting-approval":
      return `awaiting approval of ${(reason.call_ids || []).join(", ")}`;
    default:
      return String(reason.kind ?? "unknown");
  }
}

/** A stacked bar per model call: input tokens below, output above, "turn.step" under it. */
function barChart(usage) {
  const height = 80;
  const axis = 14;
  const bar = 18;
  const gap = 6;
  const peak = Math.max(1, ...usage.map((u) => u.input + u.output));
  const width = usage.length * (bar + gap);
  const chart = svg("svg", {
    class: "token-chart",
    viewBox: `0 0 ${width} ${height + axis}`,
    width,
    height: height + axis,
    role: "img",
    "aria-label": "tokens per model call",
    "data-testid": "token-svg",
  });
  chart.append(svg("line", { class: "axis", x1: 0, y1: height + 0.5, x2: width, y2: height + 0.5 }));
  usage.forEach((u, i) => {
    const x = i * (bar + gap);
    const hIn = (u.input / peak) * (height - 2);
    const hOut = (u.output / peak) * (height - 2);
    const where = `${u.turn ?? "?"}.${u.step ?? "?"}`;
    const label = `turn ${u.turn ?? "?"} step ${u.step ?? "?"}: ${num(u.input)} in, ${num(u.output)} out`;
    chart.append(
      svg(
        "g",
        { "data-testid": "token-bar" },
        svg("title", {}, label),
        svg("rect", { class: "bar-in", x, y: height - hIn, width: bar, height: hIn }),
        svg("rect", { class: "bar-out", x, y: height - hIn - hOut, width: bar, height: hOut }),
        svg("text", { class: "bar-label", x: x + bar / 2, y: height + axis - 2 }, where),
      ),
    );
  });
  return chart;
}
