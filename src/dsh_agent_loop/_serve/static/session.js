// One session's view: its summary, the fork/sub-agent tree, pending approvals, the message box,
// and its log, live.
//
// Live means: the stored events are read page by page (GET .../events), then an EventSource on
// .../stream?after_seq=<last> delivers every later event as it commits. Events pass through one
// queue in arrival order; the renderer drops any seq it has seen, and a gap (a seq beyond the
// next one) is filled from GET .../events before the event that revealed it, so the log never
// skips. EventSource reconnects by itself with Last-Event-ID; when it gives up (the server
// refused it), the view opens a new one after a pause. The summary and the pending list are
// re-read when a turn starts or ends or an approval is asked or decided, and every few seconds
// (the owner and status change without an event when a worker unloads the session).

import { ApiError, api, errorText, sessionPath } from "./api.js";
import { badge, el, num, sessionHref, showError, timeText } from "./dom.js";
import { LogRenderer } from "./log.js";
import { PendingList } from "./pending.js";

const PAGE = 1000;
/** Events after which the summary and the pending list are read again. */
const REFRESH_TYPES = new Set([
  "turn/start",
  "turn/end",
  "tool/approval-requested",
  "tool/approval",
]);
const DETAIL_POLL_MS = 5000;
const REOPEN_MS = 3000;
const RETRY_MS = 300;

const $ = (id) => document.getElementById(id);

export class SessionView {
  constructor() {
    this.id = null;
    this.source = null;
    this.log = new LogRenderer($("log"), $("token-chart"), $("token-totals"));
    this.queue = Promise.resolve();
    this.pending = new PendingList($("pending"), $("pending-list"), (...args) => this.decide(...args));
    $("send-form").addEventListener("submit", (event) => this.send(event));
    $("cancel-button").addEventListener("click", () => this.cancel());
  }

  open(id) {
    if (id === this.id) return;
    this.close();
    this.id = id;
    this.retries = 0;
    this.log.reset();
    this.pending.clear();
    $("session-head").replaceChildren(el("h1", {}, id));
    $("tree").replaceChildren();
    showError($("session-error"), "");
    showError($("send-error"), "");
    $("send-note").textContent = "";
    this.refreshDetail();
    this.poll = setInterval(() => this.refreshDetail(), DETAIL_POLL_MS);
    this.enqueue(() => this.loadStored(id));
  }

  close() {
    this.source?.close();
    this.source = null;
    clearInterval(this.poll);
    clearTimeout(this.reopen);
    clearTimeout(this.detailSoon);
    this.id = null;
    setConnNote("");
  }

  enqueue(task) {
    this.queue = this.queue.then(task).catch((err) => this.fail(err));
  }

  fail(err) {
    const missing = err instanceof ApiError && err.code === "SESSION_NOT_FOUND";
    const text = missing ? "No such session (yet): waiting for it to appear…" : errorText(err);
    showError($("session-error"), text);
  }

  async loadStored(id) {
    try {
      await this.fetchAfter(id, this.log.lastSeq);
    } catch (err) {
      // A session just created is queued for the fleet: it exists once a worker created it.
      if (!(err instanceof ApiError && err.status === 404) || id !== this.id) throw err;
      this.fail(err);
      this.retries += 1; // soon at first (a worker creates it), then every few seconds
      const delay = Math.min(RETRY_MS * this.retries, REOPEN_MS);
      this.reopen = setTimeout(() => this.enqueue(() => this.loadStored(id)), delay);
      return;
    }
    if (id === this.id) this.openStream(id);
  }

  /** Read stored events after `after` until a short page; returns when caught up. */
  async fetchAfter(id, after) {
    for (;;) {
      const page = await api(`${sessionPath(id, "events")}?after_seq=${after}&limit=${PAGE}`);
      if (id !== this.id) return;
      for (const event of page.events) this.accept(event);
      if (page.events.length < PAGE) return;
      after = this.log.lastSeq;
    }
  }

  openStream(id) {
    const source = new EventSource(`${sessionPath(id, "stream")}?after_seq=${this.log.lastSeq}`);
    this.source = source;
    source.addEventListener("open", () => setConnNote("live"));
    source.addEventListener("event", (message) => {
      let event;
      try {
        event = JSON.parse(message.data);
      } catch {
        return;
      }
      this.enqueue(() => this.streamed(id, event));
    });
    source.addEventListener("error", () => {
      if (source.readyState !== EventSource.CLOSED) {
        setConnNote("reconnecting…");
        return;
      }
      setConnNote("stream closed; retrying");
      this.refreshDetail(); // a 401 or 404 shows itself here
      this.reopen = setTimeout(() => {
        if (this.source === source && id === this.id) this.openStream(id);
      }, REOPEN_MS);
    });
  }

  async streamed(id, event) {
    if (id !== this.id) return;
    if (event.seq > this.log.lastSeq + 1) await this.fetchAfter(id, this.log.lastSeq);
    this.accept(event);
  }

  accept(event) {
    if (this.log.add(event) && REFRESH_TYPES.has(event.type)) this.refreshSoon();
  }

  refreshSoon() {
    clearTimeout(this.detailSoon);
    this.detailSoon = setTimeout(() => this.refreshDetail(), 100);
  }

  async refreshDetail() {
    const id = this.id;
    if (id === null) return;
    try {
      const detail = await api(sessionPath(id));
      if (id !== this.id) return;
      showError($("session-error"), "");
      this.renderHead(detail);
      this.renderTree(detail);
      this.pending.render(detail.pending || []);
    } catch (err) {
      if (id === this.id) this.fail(err);
    }
  }

  renderHead(d) {
    const tokens = d.tokens || {};
    const facts = [
      ["Agent", el("span", { "data-testid": "head-agent" }, d.agent)],
      ["Status", el("span", { "data-testid": "head-status", "data-status": d.status }, badge(d.status))],
      ["Owner", el("span", { "data-testid": "head-owner" }, d.owner ?? "no live worker")],
      ["Turns", num(d.turns)],
      ["Events", num(d.events)],
      ["Tokens", `${num(tokens.total)} (${num(tokens.input)} in, ${num(tokens.output)} out)`],
      ["Created", isoTime(d.created_at)],
      ["Last activity", timeText(d.last_activity)],
    ];
    if (d.parent) facts.push(["Parent", sessionLink(d.parent, "head-parent")]);
    if (d.forked_from) facts.push(["Forked from", sessionLink(d.forked_from, "head-forked-from")]);
    $("session-head").replaceChildren(
      el("h1", { "data-testid": "head-id" }, d.id),
      el("dl", {}, ...facts.map(([k, v]) => el("div", {}, el("dt", {}, k), el("dd", {}, v)))),
    );
  }

  renderTree(d) {
    const children = d.children || [];
    if (!d.parent && !d.forked_from && children.length === 0) {
      $("tree").replaceChildren();
      return;
    }
    const kids = children.map((c) =>
      el(
        "li",
        { "data-testid": "tree-child", "data-relation": c.relation },
        sessionLink(c.id),
        c.relation === "fork" ? " (fork)" : " (sub-agent)",
      ),
    );
    let node = el(
      "li",
      { class: "here", "data-testid": "tree-self" },
      el("strong", {}, d.id),
      " (this session)",
      kids.length ? el("ul", {}, ...kids) : null,
    );
    if (d.forked_from) node = treeLevel(d.forked_from, "tree-fork-source", " (fork source)", node);
    if (d.parent) node = treeLevel(d.parent, "tree-parent", " (parent)", node);
    $("tree").replaceChildren(el("h2", {}, "Related sessions"), el("ul", { class: "tree-root" }, node));
  }

  decide(callId, decision, message) {
    const body = message ? { decision, message } : { decision };
    const answer = api(sessionPath(this.id, "approvals", callId), body);
    answer.then(() => this.refreshSoon(), () => {});
    return answer;
  }

  async send(event) {
    event.preventDefault();
    const text = $("send-text").value;
    if (!text.trim()) return;
    const button = $("send-form").querySelector("button[type=submit]");
    button.disabled = true;
    try {
      const kind = $("send-kind").value;
      const { message_id: messageId } = await api(sessionPath(this.id, "messages"), { text, kind });
      showError($("send-error"), "");
      $("send-text").value = "";
      $("send-note").textContent = `Sent ${kind} ${messageId}.`;
    } catch (err) {
      showError($("send-error"), errorText(err));
    } finally {
      button.disabled = false;
    }
  }

  async cancel() {
    const button = $("cancel-button");
    button.disabled = true;
    try {
      const { applied } = await api(sessionPath(this.id, "cancel"), {});
      showError($("send-error"), "");
      const note = applied ? "Cancelled." : "Cancel queued: no worker applied it yet.";
      $("send-note").textContent = note;
      this.refreshSoon();
    } catch (err) {
      showError($("send-error"), errorText(err));
    } finally {
      button.disabled = false;
    }
  }
}

function treeLevel(id, testid, note, inner) {
  return el("li", { "data-testid": testid }, sessionLink(id), note, el("ul", {}, inner));
}

function sessionLink(id, testid = "session-link") {
  return el("a", { href: sessionHref(id), "data-testid": testid }, id);
}

function isoTime(iso) {
  const ms = Date.parse(iso ?? "");
  return Number.isNaN(ms) ? String(iso ?? "—") : timeText(ms / 1000);
}

function setConnNote(text) {
  $("conn-note").textContent = text;
}
