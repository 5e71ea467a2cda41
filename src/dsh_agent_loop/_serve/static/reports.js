// The reports view (#/reports): the simulation reports of the server's --reports DIR
// (GET /api/reports, newest first), each a link to /reports/<name> that opens in a new tab.
//
// A report is a page of its own, served with a policy that lets it load nothing, so the page only
// links to it (rel="noopener": the report gets no handle on this window). The list is read
// whenever the view is shown and every few seconds while it is (a run in progress writes its
// report when it ends); an answer that arrives after the view was left is dropped. Without
// --reports the server lists none, and the view says how to get some.

import { api, errorText } from "./api.js";
import { el, num, showError, timeText } from "./dom.js";

const POLL_MS = 5000;
const KIB = 1024;

const $ = (id) => document.getElementById(id);

export class ReportsView {
  constructor() {
    this.timer = null;
    this.busy = false;
    this.generation = 0;
  }

  show() {
    this.refresh();
    if (this.timer === null) this.timer = setInterval(() => this.refresh(), POLL_MS);
  }

  hide() {
    clearInterval(this.timer);
    this.timer = null;
    this.generation += 1; // an answer still on its way is not shown
    this.busy = false;
  }

  async refresh() {
    if (this.busy) return;
    this.busy = true;
    const generation = this.generation;
    try {
      const { reports } = await api("/api/reports");
      if (generation !== this.generation) return;
      showError($("reports-error"), "");
      this.render(reports || []);
    } catch (err) {
      if (generation === this.generation) showError($("reports-error"), errorText(err));
    } finally {
      if (generation === this.generation) this.busy = false;
    }
  }

  render(reports) {
    $("reports-body").replaceChildren(...reports.map(row));
    $("reports-table").hidden = reports.length === 0;
    $("reports-empty").hidden = reports.length > 0;
  }
}

function row(report) {
  const href = `/reports/${encodeURIComponent(report.name)}`;
  const link = { href, target: "_blank", rel: "noopener", "data-testid": "report-link" };
  const size = {
    class: "num",
    "data-testid": "report-size",
    "data-bytes": report.size,
    title: `${num(report.size)} bytes`,
  };
  return el(
    "tr",
    { "data-testid": "report-row", "data-name": report.name },
    el("td", {}, el("a", link, report.name)),
    el("td", size, sizeText(report.size)),
    el("td", { "data-testid": "report-modified" }, timeText(report.modified)),
  );
}

/** A file size for people: bytes, KiB or MiB. */
export function sizeText(bytes) {
  const value = Number(bytes ?? 0);
  if (value < KIB) return `${num(value)} B`;
  if (value < KIB * KIB) return `${(value / KIB).toFixed(1)} KiB`;
  return `${(value / (KIB * KIB)).toFixed(1)} MiB`;
}
