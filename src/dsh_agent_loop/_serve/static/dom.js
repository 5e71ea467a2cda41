// DOM helpers of the page: every string becomes a text node, never markup.
//
// The log holds what models, tools and users wrote, so nothing from it may reach innerHTML:
// el() turns string children into text nodes and sets attributes one by one, and clipped()
// bounds how much text one block shows (a tool may return megabytes).

/** Characters of one text block shown before it is cut (the rest is announced, not shown). */
export const MAX_SHOWN_CHARS = 20000;

const SVG_NS = "http://www.w3.org/2000/svg";

/**
 * Build an element: attrs are set as attributes (`class`, `data-testid`, ...), except `on*`
 * functions, which become listeners; children are nodes or strings (text nodes), null skipped.
 */
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  setAttrs(node, attrs);
  append(node, children);
  return node;
}

/** An SVG element built like el(). */
export function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  setAttrs(node, attrs);
  append(node, children);
  return node;
}

function setAttrs(node, attrs) {
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on") && typeof value === "function") {
      node.addEventListener(key.slice(2), value);
    } else {
      node.setAttribute(key, value === true ? "" : String(value));
    }
  }
}

function append(node, children) {
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(typeof child === "string" ? document.createTextNode(child) : child);
  }
}

/** `text` cut to MAX_SHOWN_CHARS, with a note of how much was left out. */
export function clipped(text) {
  const value = typeof text === "string" ? text : String(text ?? "");
  if (value.length <= MAX_SHOWN_CHARS) return value;
  const rest = value.length - MAX_SHOWN_CHARS;
  return `${value.slice(0, MAX_SHOWN_CHARS)}\n… (${rest} more characters not shown)`;
}

/** Pretty JSON of a value, or of a JSON text (raw text when it does not parse). */
export function prettyJson(value) {
  if (typeof value === "string") {
    try {
      return JSON.stringify(JSON.parse(value), null, 2);
    } catch {
      return value;
    }
  }
  return JSON.stringify(value, null, 2);
}

/** Show `message` in an error element (hide it when empty). */
export function showError(node, message) {
  node.textContent = message || "";
  node.hidden = !message;
}

/** A status badge. */
export function badge(status) {
  return el("span", { class: `badge badge-${status}`, "data-testid": "status-badge" }, status);
}

/** The link to a session's view. */
export function sessionHref(id) {
  return `#/s/${encodeURIComponent(id)}`;
}

/** A short local time for an epoch-seconds value, with the full date in the title. */
export function timeText(epochSeconds) {
  if (epochSeconds === null || epochSeconds === undefined) return el("span", {}, "—");
  const when = new Date(epochSeconds * 1000);
  const sameDay = when.toDateString() === new Date().toDateString();
  const text = sameDay ? when.toLocaleTimeString() : when.toLocaleString();
  return el("time", { datetime: when.toISOString(), title: when.toISOString() }, text);
}

/** A number with thousands separators. */
export function num(value) {
  return Number(value ?? 0).toLocaleString("en-US");
}
