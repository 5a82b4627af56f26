// What the operator console and the customer portal share: calling the
// relay's API with a bearer token, the alert and status regions, actions
// that mark their button busy or ask for confirmation, time and number
// formatting, and the DOM building blocks. Plain DOM: data only ever goes
// in through textContent and attributes, never as markup.

export const $ = (id) => document.getElementById(id);

const CONFIRM_MS = 5000;

// ---------------------------------------------------------------------------
// The token and the API

/** How the page finds its token, and what a refused one does. */
const auth = { token: () => null, refused: () => false };

/**
 * Sets where `api` takes its bearer token from, and `refused`, called with
 * a 401 error: it returns true when it handled it (by signing out, say).
 */
export function authenticate({ token, refused }) {
  auth.token = token;
  auth.refused = refused;
}

/** An error answered by the relay (`status` set) or a failed request. */
export class ApiError extends Error {
  constructor(message, { status = 0, code = null, requestId = null } = {}) {
    super(message);
    this.name = 'ApiError';
    this.status = status;
    this.code = code;
    this.requestId = requestId;
  }
}

/**
 * Calls the relay's API with the bearer token; resolves with the parsed JSON
 * answer (null for an empty one) and throws an ApiError carrying the API's
 * own message otherwise. `token` overrides the stored one (for signing in).
 */
export async function api(method, path, body, { token = auth.token() } = {}) {
  const headers = { accept: 'application/json', authorization: `Bearer ${token ?? ''}` };
  const init = { method, headers, cache: 'no-store', credentials: 'omit' };
  if (body !== undefined) {
    headers['content-type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch {
    throw new ApiError('The relay could not be reached: check that it is running and that this network can reach it, then try again.');
  }
  const answer = await readJson(response);
  if (!response.ok) {
    const error = answer?.error;
    const message = typeof error?.message === 'string' && error.message
      ? error.message
      : `The relay answered ${response.status} ${response.statusText}`.trim();
    throw new ApiError(message, { status: response.status, code: error?.code ?? null, requestId: error?.requestId ?? null });
  }
  return answer;
}

export async function readJson(response) {
  const text = await response.text().catch(() => '');
  if (!text) return null;
  try {
    return JSON.parse(text);
  } catch {
    return null;
  }
}

/** `?a=1&b=2` from the entries whose value is neither empty nor null. */
export function query(entries) {
  const params = new URLSearchParams();
  for (const [name, value] of Object.entries(entries)) {
    if (value !== null && value !== undefined && value !== '') params.set(name, String(value));
  }
  const text = params.toString();
  return text ? `?${text}` : '';
}

// ---------------------------------------------------------------------------
// Alerts and status

let alertOwner = null;

/** Shows `message` in the alert region; `owner` lets a poller clear only its own. */
export function showError(message, owner = 'action') {
  alertOwner = owner;
  // Rewriting the same text would have it announced again at every poll.
  if ($('alert').classList.contains('shown') && $('alert-text').textContent === message) return;
  $('alert-text').textContent = message;
  $('alert-dismiss').hidden = false;
  $('alert').classList.add('shown');
}

export function clearError(owner) {
  if (owner && owner !== alertOwner) return;
  alertOwner = null;
  $('alert-text').textContent = '';
  $('alert-dismiss').hidden = true;
  $('alert').classList.remove('shown');
}

export function say(message) {
  $('status').textContent = message;
}

/** What an error means to the page: a refused token is the page's to handle, anything else is shown. */
export function report(error, owner = 'action') {
  if (error instanceof ApiError && error.status === 401 && auth.token() && auth.refused(error, owner)) return;
  showError(error.message || String(error), owner);
}

/**
 * Runs a user's action: clears the last error, marks `button` busy (a
 * second click meanwhile does nothing) and reports a failure.
 */
export async function act(button, action) {
  if (button?.dataset.busy === 'true') return;
  if (button) {
    button.dataset.busy = 'true';
    button.setAttribute('aria-busy', 'true');
  }
  clearError();
  try {
    await action();
  } catch (error) {
    report(error);
  } finally {
    if (button) {
      delete button.dataset.busy;
      button.removeAttribute('aria-busy');
    }
  }
}

/**
 * A button that asks for a second click before it acts: the first turns it
 * into "Confirm …" for a few seconds.
 */
export function confirmFirst(button, confirmLabel, action) {
  if (button.dataset.confirming !== 'true') {
    const label = button.textContent;
    button.dataset.confirming = 'true';
    button.classList.add('confirming');
    button.textContent = confirmLabel;
    say(`Press “${confirmLabel}” again within ${CONFIRM_MS / 1000} seconds to confirm.`);
    const reset = () => {
      button.dataset.confirming = 'false';
      button.classList.remove('confirming');
      button.textContent = label;
    };
    button.confirmTimer = setTimeout(reset, CONFIRM_MS);
    button.resetConfirm = reset;
    return;
  }
  clearTimeout(button.confirmTimer);
  button.resetConfirm?.();
  return act(button, action);
}

// ---------------------------------------------------------------------------
// Formatting

const relativeFormat = new Intl.RelativeTimeFormat(undefined, { numeric: 'auto' });
const dateFormat = new Intl.DateTimeFormat(undefined, { dateStyle: 'medium', timeStyle: 'medium' });
const clockFormat = new Intl.DateTimeFormat(undefined, { timeStyle: 'medium' });
const dayFormat = new Intl.DateTimeFormat(undefined, { month: 'short', day: 'numeric', hour: '2-digit', minute: '2-digit' });
const numberFormat = new Intl.NumberFormat(undefined, { maximumFractionDigits: 2 });

export function localTime(iso) {
  const date = new Date(iso);
  return Number.isNaN(date.getTime()) ? String(iso) : dateFormat.format(date);
}

/** For tables: the time alone today, else the day and the minute. */
export function shortTime(iso) {
  const date = new Date(iso);
  if (Number.isNaN(date.getTime())) return String(iso);
  return date.toDateString() === new Date().toDateString() ? clockFormat.format(date) : dayFormat.format(date);
}

/** "3 minutes ago", "in 5 seconds". */
export function relativeTime(iso, now = Date.now()) {
  const seconds = Math.round((new Date(iso).getTime() - now) / 1000);
  const size = Math.abs(seconds);
  if (Number.isNaN(seconds)) return '';
  if (size < 45) return relativeFormat.format(seconds, 'second');
  if (size < 45 * 60) return relativeFormat.format(Math.round(seconds / 60), 'minute');
  if (size < 22 * 3600) return relativeFormat.format(Math.round(seconds / 3600), 'hour');
  return relativeFormat.format(Math.round(seconds / 86400), 'day');
}

export function formatNumber(value) {
  return value === null || value === undefined || Number.isNaN(value) ? '—' : numberFormat.format(value);
}

/** A `datetime-local` value (local time, to the second) for `date`. */
export function toLocalInput(date) {
  const shifted = new Date(date.getTime() - date.getTimezoneOffset() * 60000);
  return shifted.toISOString().slice(0, 19);
}

/** RFC 3339 (UTC) for a `datetime-local` value, or null when empty or unreadable. */
export function fromLocalInput(value) {
  if (!value) return null;
  const date = new Date(value);
  return Number.isNaN(date.getTime()) ? null : date.toISOString();
}

// ---------------------------------------------------------------------------
// DOM building blocks

export function element(tag, { className, text, attrs } = {}, children = []) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined && text !== null) node.textContent = String(text);
  for (const [name, value] of Object.entries(attrs ?? {})) node.setAttribute(name, value);
  node.append(...children);
  return node;
}

export function cell(content, className) {
  const td = element('td', { className });
  if (content instanceof Node) td.append(content);
  else td.textContent = content === null || content === undefined || content === '' ? '—' : String(content);
  return td;
}

/** A local time with its relative form beneath, or `empty`; `short` for tables. */
export function timeNode(iso, empty = '—', { short = true } = {}) {
  if (!iso) return document.createTextNode(empty);
  const time = element('time', { text: short ? shortTime(iso) : localTime(iso), attrs: { datetime: iso, title: localTime(iso) } });
  const ago = element('span', { className: 'relative', text: relativeTime(iso) });
  return element('span', { className: 'when' }, [time, ago]);
}

export function badge(text, kind) {
  return element('span', { className: `badge badge-${kind}`, text });
}

/**
 * A button for a table row. `slot` names its place when its action changes
 * between renders (pause and resume), so focus can come back to it.
 */
export function button(label, { action, id, ariaLabel, className, slot = action } = {}) {
  const node = element('button', { className, text: label, attrs: { type: 'button' } });
  if (action) node.dataset.action = action;
  if (id !== undefined) node.dataset.id = String(id);
  if (slot) node.dataset.focusKey = `${slot}:${id ?? ''}`;
  if (ariaLabel) node.setAttribute('aria-label', ariaLabel);
  return node;
}

/**
 * Re-renders `container` with `render` and gives focus back to the element
 * that had it, found again by its focus key.
 */
export function keepingFocus(container, render) {
  const active = document.activeElement;
  const key = container.contains(active) ? active.dataset.focusKey : undefined;
  render();
  if (key !== undefined) container.querySelector(`[data-focus-key="${CSS.escape(key)}"]`)?.focus();
}

export function showEmpty(id, empty) {
  $(id).hidden = !empty;
}
