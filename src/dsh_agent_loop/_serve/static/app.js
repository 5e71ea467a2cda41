// The page's entry: routing by URL hash (#/ the list, #/s/<id> one session, #/reports the
// simulation reports), the sessions list with its filters, live status and the "New session"
// form, and the token prompt on a 401.
//
// The list refreshes itself every 2 s while it is shown (the API's GET /api/sessions; a poll
// already in flight is not doubled). The session view lives in session.js, the reports view in
// reports.js. A view that is left stops its polls and its stream.

import { api, errorText, onUnauthorized, submitToken } from "./api.js";
import { badge, el, num, sessionHref, showError, timeText } from "./dom.js";
import { ReportsView } from "./reports.js";
import { SessionView } from "./session.js";

const POLL_MS = 2000;
const PAGE = 50;
const MAX_LIMIT = 500;
const REPORTS_HASH = "#/reports";
/** The views, by the prefix of their element ids; the header's nav link of each. */
const VIEWS = ["list", "session", "reports"];
const NAV = { list: "nav-sessions", session: "nav-sessions", reports: "nav-reports" };

const $ = (id) => document.getElementById(id);

class ListView {
  constructor() {
    this.limit = PAGE;
    this.timer = null;
    this.busy = false;
    this.generation = 0;
    this.agentsSeen = new Set();
    $("q").addEventListener("input", () => this.refilter());
    $("status-filter").addEventListener("change", () => this.refilter());
    $("agent-filter").addEventListener("change", () => this.refilter());
    $("filters").addEventListener("submit", (event) => event.preventDefault());
    $("more").addEventListener("click", () => {
      this.limit = Math.min(this.limit + PAGE, MAX_LIMIT);
      this.refresh();
    });
    $("new-form").addEventListener("submit", (event) => this.create(event));
  }

  show() {
    this.refresh();
    this.loadAgents();
    if (this.timer === null) this.timer = setInterval(() => this.refresh(), POLL_MS);
  }

  hide() {
    clearInterval(this.timer);
    this.timer = null;
  }

  refilter() {
    this.limit = PAGE;
    this.generation += 1; // an answer to an older filter is dropped
    this.busy = false;
    this.refresh();
  }

  query() {
    const params = new URLSearchParams({ limit: String(this.limit) });
    const q = $("q").value.trim();
    if (q) params.set("q", q);
    if ($("status-filter").value) params.set("status", $("status-filter").value);
    if ($("agent-filter").value) params.set("agent", $("agent-filter").value);
    return `/api/sessions?${params}`;
  }

  async refresh() {
    if (this.busy) return;
    this.busy = true;
    const generation = this.generation;
    try {
      const page = await api(this.query());
      if (generation !== this.generation) return;
      showError($("list-error"), "");
      this.render(page);
    } catch (err) {
      if (generation === this.generation) showError($("list-error"), errorText(err));
    } finally {
      if (generation === this.generation) this.busy = false;
    }
  }

  render(page) {
    const rows = (page.sessions || []).map((s) => this.row(s));
    $("sessions-body").replaceChildren(...rows);
    $("list-empty").hidden = rows.length > 0;
    $("more").hidden = !page.next_cursor || this.limit >= MAX_LIMIT;
    for (const s of page.sessions || []) this.addAgentOption(s.agent);
  }

  row(s) {
    const open = () => window.location.assign(sessionHref(s.id));
    const tokens = s.tokens || {};
    const split = `in ${num(tokens.input)}, out ${num(tokens.output)}`;
    return el(
      "tr",
      { "data-testid": "session-row", "data-session-id": s.id, "data-status": s.status, onclick: open },
      el("td", {}, el("a", { href: sessionHref(s.id), "data-testid": "session-link" }, s.id)),
      el("td", { "data-testid": "row-agent" }, s.agent),
      el("td", {}, badge(s.status), pendingNote(s.pending_approvals)),
      el("td", { class: "num", "data-testid": "row-turns" }, num(s.turns)),
      el("td", { class: "num", "data-testid": "row-tokens", title: split }, num(tokens.total)),
      el("td", {}, timeText(s.last_activity)),
    );
  }

  addAgentOption(agent) {
    if (!agent || this.agentsSeen.has(agent)) return;
    this.agentsSeen.add(agent);
    $("agent-filter").append(el("option", { value: agent }, agent));
  }

  async loadAgents() {
    try {
      const { agents } = await api("/api/agents");
      const select = $("new-agent");
      const chosen = select.value;
      select.replaceChildren(...agents.map((a) => el("option", { value: a.id }, agentLabel(a))));
      if (chosen) select.value = chosen;
      for (const a of agents) this.addAgentOption(a.id);
    } catch (err) {
      showError($("new-error"), errorText(err));
    }
  }

  async create(event) {
    event.preventDefault();
    const body = { agent: $("new-agent").value || undefined };
    const sid = $("new-id").value.trim();
    const prompt = $("new-prompt").value;
    if (sid) body.session_id = sid;
    if (prompt.trim()) body.prompt = prompt;
    const button = $("new-form").querySelector("button");
    button.disabled = true;
    try {
      const created = await api("/api/sessions", body);
      showError($("new-error"), "");
      $("new-id").value = "";
      $("new-prompt").value = "";
      $("new-form").closest("details").open = false;
      window.location.assign(sessionHref(created.id));
    } catch (err) {
      showError($("new-error"), errorText(err));
    } finally {
      button.disabled = false;
    }
  }
}

function agentLabel(agent) {
  return agent.model ? `${agent.id} (${agent.provider ?? "?"}/${agent.model})` : agent.id;
}

function pendingNote(count) {
  if (!count) return null;
  return el("span", { class: "pending-count", title: "calls waiting for approval" }, ` ${count}`);
}

class App {
  constructor() {
    this.list = new ListView();
    this.session = new SessionView();
    this.reports = new ReportsView();
    onUnauthorized(() => this.askToken());
    $("token-form").addEventListener("submit", async (event) => {
      event.preventDefault();
      showError($("token-error"), await submitToken($("token-input").value, window.location.hash));
    });
    window.addEventListener("hashchange", () => this.route());
  }

  route() {
    const hash = window.location.hash;
    const match = /^#\/s\/(.+)$/.exec(hash);
    const view = match ? "session" : hash === REPORTS_HASH ? "reports" : "list";
    $("token-view").hidden = true;
    this.leave(view);
    showView(view);
    if (view === "session") this.session.open(decodeURIComponent(match[1]));
    else if (view === "reports") this.reports.show();
    else this.list.show();
  }

  /** Stop the polls and streams of every view but `kept`. */
  leave(kept) {
    if (kept !== "list") this.list.hide();
    if (kept !== "session") this.session.close();
    if (kept !== "reports") this.reports.hide();
  }

  askToken() {
    this.leave(null);
    showView(null);
    $("token-view").hidden = false;
    $("token-input").focus();
  }
}

/** Show the view `shown` (none when null) and mark its link in the header as the current page. */
function showView(shown) {
  for (const view of VIEWS) $(`${view}-view`).hidden = view !== shown;
  for (const id of new Set(Object.values(NAV))) {
    if (id === NAV[shown]) $(id).setAttribute("aria-current", "page");
    else $(id).removeAttribute("aria-current");
  }
}

new App().route();
