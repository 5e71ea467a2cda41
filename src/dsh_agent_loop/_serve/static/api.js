// The page's one door to the JSON API: fetch with the session cookie, JSON in and out, and the
// API's coded errors ({"error": {"code", "message"}}) as ApiError. A 401 anywhere shows the
// token form, whose submit goes to /?token=..., where the server sets its HttpOnly cookie and
// redirects back to / without the token.

/** An error the API returned (or a network failure, code NETWORK). */
export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

const listeners = new Set();

/** Call `fn()` whenever a request is refused with 401. */
export function onUnauthorized(fn) {
  listeners.add(fn);
}

/** The path of a session's API resource (`parts` appended, each URL-encoded). */
export function sessionPath(id, ...parts) {
  return ["/api/sessions", encodeURIComponent(id), ...parts.map(encodeURIComponent)].join("/");
}

/**
 * Request `path` and return its JSON body.
 *
 * GET without `body`; with one, a JSON POST. Throws ApiError with the API's code and message.
 */
export async function api(path, body) {
  const init = { credentials: "same-origin", headers: { Accept: "application/json" } };
  if (body !== undefined) {
    init.method = "POST";
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (err) {
    throw new ApiError(0, "NETWORK", `the server did not answer (${err.message})`);
  }
  const payload = await readJson(response);
  if (response.ok) return payload;
  if (response.status === 401) for (const fn of listeners) fn();
  const error = payload && typeof payload.error === "object" ? payload.error : {};
  throw new ApiError(
    response.status,
    String(error.code ?? `HTTP_${response.status}`),
    String(error.message ?? response.statusText ?? "request failed"),
  );
}

async function readJson(response) {
  const type = response.headers.get("Content-Type") || "";
  if (!type.includes("json")) return null;
  try {
    return await response.json();
  } catch {
    return null;
  }
}

/** The text shown for a failed request: its message and code. */
export function errorText(err) {
  if (err instanceof ApiError) return `${err.message} (${err.code})`;
  return String(err?.message ?? err);
}

/**
 * Check `token` with one bearer request, then send the browser to /?token=T: the server keeps it
 * as an HttpOnly cookie and redirects to / (the hash stays in the browser, so the view chosen
 * before the prompt is kept). Returns the error text when the server refuses the token.
 */
export async function submitToken(token, hash) {
  const value = token.trim();
  let response;
  try {
    response = await fetch("/api/agents", {
      credentials: "omit",
      headers: { Accept: "application/json", Authorization: `Bearer ${value}` },
    });
  } catch (err) {
    return `the server did not answer (${err.message})`;
  }
  if (response.status === 401) return "The server refused this token.";
  const back = hash && hash !== "#" ? hash : "";
  window.location.assign(`/?token=${encodeURIComponent(value)}${back}`);
  return "";
}
