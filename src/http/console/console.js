// The operator console's behaviour: signing in with the admin token, the
// admin API calls, hash routing between the Webhooks, Live and Streams
// sections, and rendering their tables, forms and sparklines. Plain DOM:
// data only ever goes in through textContent and attributes, never as markup.
// The building blocks it shares with the customer portal are in ui.js.

import {
  $, act, api, authenticate, badge, button, cell, clearError, confirmFirst, element,
  formatNumber, fromLocalInput, keepingFocus, localTime, query, relativeTime, report, say,
  showEmpty, showError, timeNode, toLocalInput,
} from './ui.js';

const TOKEN_KEY = 'eventrelay.adminToken';
const METRICS_EVERY_MS = 3000;
const SAMPLES = 40;
const LOG_PAGE = 50;
const STREAMS_PAGE = 100;
const DELIVERY_POLL_MS = 1000;
const VIEWS = ['webhooks', 'live', 'streams'];
const SVG = 'http://www.w3.org/2000/svg';

function adminToken() {
  return sessionStorage.getItem(TOKEN_KEY);
}

// A refused admin token signs out.
authenticate({
  token: adminToken,
  refused(error, owner) {
    signOut();
    showError(`${error.message}. Sign in again.`, owner);
    return true;
  },
});

// ---------------------------------------------------------------------------
// Webhooks: subscriptions

const webhooks = {
  subscriptions: [],
  log: { before: null, nextBefore: null, pages: [] },
  delivery: null,
  deliveryTimer: null,
  redeliverFor: null,
};

async function loadSubscriptions() {
  const { subscriptions } = await api('GET', '/v1/admin/subscriptions?health=true');
  webhooks.subscriptions = subscriptions;
  keepingFocus($('subscriptions-body'), renderSubscriptions);
  fillSubscriptionSelect();
}

function renderSubscriptions() {
  const rows = webhooks.subscriptions.map(subscriptionRow);
  $('subscriptions-body').replaceChildren(...rows);
  showEmpty('subscriptions-empty', rows.length === 0);
}

function subscriptionRow(subscription) {
  const { id, url, types, scopeKey, maxPerSecond, ordering, pausedAt, pausedReason, source, health } = subscription;
  const tr = element('tr');
  tr.dataset.subscriptionId = id;
  tr.dataset.state = pausedAt ? 'paused' : 'active';
  const idCell = element('th', { attrs: { scope: 'row' } }, [element('span', { className: 'mono', text: id })]);
  if (source === 'config') idCell.append(' ', badge('config', 'neutral'));
  const state = pausedAt
    ? element('span', { className: 'state' }, [
      badge(pausedReason === 'failing' ? 'paused: failing' : 'paused', pausedReason === 'failing' ? 'bad' : 'warn'),
      element('span', { className: 'relative', text: `since ${relativeTime(pausedAt)}` }),
    ])
    : badge('active', 'ok');
  tr.append(
    idCell,
    cell(url, 'url'),
    cell(types.join(', '), 'mono'),
    cell(scopeKey ?? 'all scopes', scopeKey ? 'mono' : 'muted'),
    cell(ordering && ordering !== 'none' ? `per ${ordering}` : 'any', ordering && ordering !== 'none' ? '' : 'muted'),
    cell(maxPerSecond ? `${formatNumber(maxPerSecond)}/s` : 'no limit', maxPerSecond ? 'num' : 'muted'),
    cell(state),
    cell(timeNode(health?.lastSuccessAt, health ? 'never' : '—')),
    cell(health ? health.failuresLastHour : null, health?.failuresLastHour ? 'num bad' : 'num'),
    cell(timeNode(health?.oldestDueAt, health ? 'none' : '—')),
    cell(health ? health.pending : null, 'num'),
    cell(subscriptionActions(subscription), 'actions'),
  );
  return tr;
}

function subscriptionActions({ id, pausedAt }) {
  const toggle = pausedAt
    ? button('Resume', { action: 'resume', id, ariaLabel: `Resume ${id}`, slot: 'toggle' })
    : button('Pause', { action: 'pause', id, ariaLabel: `Pause ${id}`, slot: 'toggle' });
  return element('div', { className: 'row-actions' }, [
    toggle,
    button('Rotate secret', { action: 'rotate', id, ariaLabel: `Rotate the secret of ${id}` }),
    button('Redeliver failed…', { action: 'redeliver-failed', id, ariaLabel: `Redeliver failed deliveries of ${id}` }),
    button('Show deliveries', { action: 'show-deliveries', id, ariaLabel: `Show the deliveries of ${id}` }),
  ]);
}

function fillSubscriptionSelect() {
  const select = $('log-subscription');
  const chosen = select.value;
  const options = webhooks.subscriptions.map((s) => element('option', { text: s.id, attrs: { value: s.id } }));
  select.replaceChildren(element('option', { text: 'Any', attrs: { value: '' } }), ...options);
  ensureOption(select, chosen);
  select.value = chosen;
}

function ensureOption(select, value) {
  if (value && ![...select.options].some((o) => o.value === value)) {
    select.append(element('option', { text: value, attrs: { value } }));
  }
}

async function onSubscriptionAction(event) {
  const target = event.target.closest('button[data-action]');
  if (!target) return;
  const id = target.dataset.id;
  switch (target.dataset.action) {
    case 'pause':
    case 'resume':
      return act(target, () => setPaused(id, target.dataset.action === 'pause'));
    case 'rotate':
      return confirmFirst(target, 'Confirm rotate', () => rotateSecret(id));
    case 'redeliver-failed':
      return openRedeliverFailed(id);
    case 'show-deliveries':
      return showDeliveriesOf(id);
  }
}

async function setPaused(id, paused) {
  const verb = paused ? 'pause' : 'resume';
  await api('POST', `/v1/admin/subscriptions/${encodeURIComponent(id)}/${verb}`);
  say(paused ? `Subscription ${id} is paused: its deliveries queue up until it is resumed.` : `Subscription ${id} is active again.`);
  await loadSubscriptions();
}

async function rotateSecret(id) {
  const answer = await api('POST', `/v1/admin/subscriptions/${encodeURIComponent(id)}/rotate-secret`);
  const grace = answer.previousSecretExpiresAt
    ? ` The previous secret keeps signing too until ${localTime(answer.previousSecretExpiresAt)}.`
    : '';
  showSecret(id, answer.secret, grace);
  say(`The secret of ${id} was rotated.`);
  await loadSubscriptions();
}

function showSecret(subscriptionId, secret, extra = '') {
  $('secret-subscription').textContent = subscriptionId;
  $('secret-value').textContent = secret;
  $('secret-note').textContent = `Copy it now and store it with the receiver: it will not be shown again.${extra}`;
  $('secret-box').hidden = false;
  $('secret-box').focus();
}

function dismissSecret() {
  $('secret-value').textContent = '';
  $('secret-box').hidden = true;
  say('The secret was dismissed.');
}

async function copySecret() {
  const secret = $('secret-value').textContent;
  try {
    await navigator.clipboard.writeText(secret);
    say('The secret is on the clipboard.');
  } catch {
    const range = document.createRange();
    range.selectNodeContents($('secret-value'));
    getSelection().removeAllRanges();
    getSelection().addRange(range);
    say('The clipboard is not available here: the secret is selected, copy it with the keyboard.');
  }
}

function openRedeliverFailed(id) {
  webhooks.redeliverFor = id;
  $('redeliver-failed-subscription').textContent = id;
  $('redeliver-failed-since').value = toLocalInput(new Date(Date.now() - 3600 * 1000));
  $('redeliver-failed-form').hidden = false;
  $('redeliver-failed-since').focus();
}

function closeRedeliverFailed() {
  const id = webhooks.redeliverFor;
  $('redeliver-failed-form').hidden = true;
  webhooks.redeliverFor = null;
  $('subscriptions-body').querySelector(`[data-action="redeliver-failed"][data-id="${CSS.escape(id ?? '')}"]`)?.focus();
}

async function redeliverFailed(event) {
  event.preventDefault();
  const id = webhooks.redeliverFor;
  const since = fromLocalInput($('redeliver-failed-since').value);
  await act(event.submitter, async () => {
    if (!since) throw new Error('Choose the time from which failed deliveries are sent again.');
    const { redelivered } = await api('POST', `/v1/admin/subscriptions/${encodeURIComponent(id)}/redeliver-failed`, { since });
    say(`${redelivered} failed ${redelivered === 1 ? 'delivery' : 'deliveries'} of ${id} ${redelivered === 1 ? 'is' : 'are'} back in the queue.`);
    closeRedeliverFailed();
    await Promise.all([loadSubscriptions(), loadLog()]);
  });
}

async function showDeliveriesOf(id) {
  const select = $('log-subscription');
  ensureOption(select, id);
  select.value = id;
  await act(null, () => loadLog({ before: null }));
  $('log-title').focus();
  $('log-title').scrollIntoView({ block: 'start' });
}

async function createSubscription(event) {
  event.preventDefault();
  const form = event.currentTarget;
  const body = {
    id: $('create-id').value.trim(),
    url: $('create-url').value.trim(),
  };
  const types = $('create-types').value.split(',').map((t) => t.trim()).filter(Boolean);
  if (types.length) body.types = types;
  const scopeKey = $('create-scope').value.trim();
  if (scopeKey) body.scopeKey = scopeKey;
  const ordering = $('create-ordering').value;
  if (ordering !== 'none') body.ordering = ordering;
  const rate = $('create-rate').value.trim();
  // Sent as typed: the API names what is wrong with it.
  if (rate) body.maxPerSecond = Number(rate);
  await act(event.submitter, async () => {
    const answer = await api('POST', '/v1/admin/subscriptions', body);
    form.reset();
    showSecret(answer.subscription.id, answer.secret);
    say(`Subscription ${answer.subscription.id} was created.`);
    await loadSubscriptions();
  });
}

// ---------------------------------------------------------------------------
// Webhooks: the delivery log and one delivery

function logFilter() {
  return {
    subscriptionId: $('log-subscription').value,
    status: $('log-status').value,
    eventType: $('log-type').value.trim(),
    since: fromLocalInput($('log-since').value),
    until: fromLocalInput($('log-until').value),
  };
}

/** Loads a page of the log: the newest with `before: null`, else older than `before`. */
async function loadLog({ before = webhooks.log.before } = {}) {
  const { deliveries, nextBefore } = await api('GET', `/v1/admin/deliveries${query({ ...logFilter(), before, limit: LOG_PAGE })}`);
  if (before === null) webhooks.log.pages = [];
  else if (webhooks.log.pages.at(-1) !== before) webhooks.log.pages.push(before);
  webhooks.log.before = before;
  webhooks.log.nextBefore = nextBefore;
  keepingFocus($('log-body'), () => renderLog(deliveries));
}

function renderLog(deliveries) {
  const rows = deliveries.map(deliveryRow);
  $('log-body').replaceChildren(...rows);
  showEmpty('log-empty', rows.length === 0);
  $('log-older').disabled = webhooks.log.nextBefore === null;
  const page = webhooks.log.pages.length + 1;
  $('log-page').textContent = `Page ${page}, ${deliveries.length} ${deliveries.length === 1 ? 'delivery' : 'deliveries'}`;
}

function deliveryRow(delivery) {
  const tr = element('tr', { className: 'clickable' });
  tr.dataset.deliveryId = delivery.id;
  tr.dataset.status = delivery.status;
  if (webhooks.delivery?.id === delivery.id) tr.classList.add('selected');
  const open = button(`#${delivery.id}`, { action: 'open-delivery', id: delivery.id, ariaLabel: `Open delivery ${delivery.id}`, className: 'link' });
  tr.append(
    element('th', { attrs: { scope: 'row' } }, [open]),
    cell(timeNode(delivery.createdAt)),
    cell(delivery.subscriptionId, 'mono'),
    cell(delivery.eventType, 'mono'),
    cell(delivery.scopeKey, 'mono'),
    cell(statusBadge(delivery.status)),
    cell(delivery.attempts, 'num'),
    cell(delivery.lastStatus, 'num'),
    cell(delivery.status === 'pending' ? timeNode(delivery.nextAttemptAt) : '—'),
  );
  return tr;
}

function statusBadge(status) {
  const kind = { delivered: 'ok', pending: 'warn', dead: 'bad', gone: 'neutral' }[status] ?? 'neutral';
  return badge(status, kind);
}

function onLogClick(event) {
  const row = event.target.closest('tr[data-delivery-id]');
  if (!row) return;
  const trigger = event.target.closest('button') ?? null;
  act(trigger, () => openDelivery(row.dataset.deliveryId, { focus: true }));
}

async function openDelivery(id, { focus = false } = {}) {
  const answer = await api('GET', `/v1/admin/deliveries/${encodeURIComponent(id)}`);
  renderDelivery(answer);
  $('delivery').hidden = false;
  for (const row of $('log-body').rows) row.classList.toggle('selected', row.dataset.deliveryId === String(id));
  if (focus) {
    $('delivery-title').focus();
    $('delivery').scrollIntoView({ block: 'start' });
  }
  pollDelivery();
}

function renderDelivery({ delivery, attempts }) {
  const previous = webhooks.delivery;
  webhooks.delivery = delivery;
  const section = $('delivery');
  section.dataset.deliveryId = delivery.id;
  section.dataset.status = delivery.status;
  $('delivery-title').textContent = `Delivery #${delivery.id}`;
  $('delivery-fields').replaceChildren(...deliveryFields(delivery));
  const rows = attempts.map(attemptRow);
  $('attempts-body').replaceChildren(...rows);
  showEmpty('attempts-empty', rows.length === 0);
  if (previous?.id === delivery.id && previous.status !== delivery.status) {
    say(`Delivery ${delivery.id} is now ${delivery.status}.`);
    loadLog().catch((error) => report(error, 'refresh'));
    loadSubscriptions().catch((error) => report(error, 'refresh'));
  }
}

function deliveryFields(delivery) {
  const fields = [
    ['Status', statusBadge(delivery.status)],
    ['Subscription', delivery.subscriptionId],
    ['Event type', delivery.eventType],
    ['Scope', delivery.scopeKey],
    ['Event id', delivery.eventId],
    ['Event seq', delivery.eventSeq],
    ['Attempts', delivery.attempts],
    ['Last status code', delivery.lastStatus],
    ['Last error', delivery.lastError],
    ['Next attempt', delivery.status === 'pending' ? timeNode(delivery.nextAttemptAt, '—', { short: false }) : null],
    ['Created', timeNode(delivery.createdAt, '—', { short: false })],
    ['Updated', timeNode(delivery.updatedAt, '—', { short: false })],
  ];
  return fields.map(([name, value]) => {
    const dd = element('dd');
    if (value instanceof Node) dd.append(value);
    else dd.textContent = value === null || value === undefined || value === '' ? '—' : String(value);
    return element('div', {}, [element('dt', { text: name }), dd]);
  });
}

function attemptRow(attempt) {
  const response = attempt.response === null || attempt.response === undefined
    ? document.createTextNode('—')
    : element('pre', { className: 'response', text: attempt.response });
  const outcome = { delivered: 'ok', retry: 'warn', dead: 'bad', gone: 'neutral' }[attempt.outcome] ?? 'neutral';
  return element('tr', {}, [
    element('th', { className: 'num', text: attempt.attempt, attrs: { scope: 'row' } }),
    cell(timeNode(attempt.startedAt)),
    cell(attempt.durationMs, 'num'),
    cell(attempt.statusCode, 'num'),
    cell(badge(attempt.outcome, outcome)),
    cell(attempt.error, 'error-text'),
    cell(response, 'answer'),
  ]);
}

/** While the shown delivery is pending, reads it again every second. */
function pollDelivery() {
  clearTimeout(webhooks.deliveryTimer);
  const delivery = webhooks.delivery;
  if (!delivery || delivery.status !== 'pending' || $('delivery').hidden) return;
  webhooks.deliveryTimer = setTimeout(async () => {
    if ($('delivery').hidden || currentView() !== 'webhooks' || !adminToken()) return;
    try {
      renderDelivery(await api('GET', `/v1/admin/deliveries/${encodeURIComponent(delivery.id)}`));
      clearError('delivery');
    } catch (error) {
      report(error, 'delivery');
    }
    pollDelivery();
  }, DELIVERY_POLL_MS);
}

async function redeliver() {
  const id = webhooks.delivery?.id;
  if (id === undefined) return;
  const answer = await api('POST', `/v1/admin/deliveries/${encodeURIComponent(id)}/redeliver`);
  renderDelivery(answer);
  say(`Delivery ${id} is back in the queue, due now.`);
  await loadLog();
  pollDelivery();
}

function closeDelivery() {
  const id = webhooks.delivery?.id;
  clearTimeout(webhooks.deliveryTimer);
  webhooks.delivery = null;
  $('delivery').hidden = true;
  for (const row of $('log-body').rows) row.classList.remove('selected');
  const opener = $('log-body').querySelector(`[data-action="open-delivery"][data-id="${CSS.escape(String(id ?? ''))}"]`);
  (opener ?? $('log-title')).focus();
}

function loadWebhooks() {
  return Promise.all([loadSubscriptions(), loadLog(), loadCatalog()]);
}

// ---------------------------------------------------------------------------
// Webhooks: the event catalog

async function loadCatalog() {
  const { eventTypes } = await api('GET', '/v1/event-types');
  $('catalog-body').replaceChildren(...eventTypes.map(catalogRow));
  showEmpty('catalog-empty', eventTypes.length === 0);
  const offered = eventTypes.map(({ type }) => element('option', { attrs: { value: type } }));
  $('create-types-catalog').replaceChildren(...offered);
}

function catalogRow({ type, description, schema }) {
  const tr = element('tr');
  tr.dataset.eventType = type;
  const shown = element('details', {}, [
    element('summary', { text: 'JSON Schema' }),
    element('pre', { className: 'mono', text: JSON.stringify(schema, null, 2) }),
  ]);
  tr.append(
    element('th', { attrs: { scope: 'row' } }, [element('span', { className: 'mono', text: type })]),
    cell(description ?? '—', description ? '' : 'muted'),
    cell(shown),
  );
  return tr;
}

// ---------------------------------------------------------------------------
// Live: the metrics text, figures and sparklines

/**
 * Reads the Prometheus / OpenMetrics text format: `name{labels} value
 * [timestamp]` lines; `#` lines and anything unreadable are skipped.
 * Returns a Map from metric name to its samples, `{labels, value}`.
 */
function parseMetrics(text) {
  const metrics = new Map();
  for (const raw of text.split('\n')) {
    const line = raw.trim();
    if (!line || line.startsWith('#')) continue;
    const match = /^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)/.exec(line);
    if (!match) continue;
    const value = parseValue(match[3]);
    if (value === null) continue;
    const samples = metrics.get(match[1]) ?? [];
    samples.push({ labels: parseLabels(match[2] ?? ''), value });
    metrics.set(match[1], samples);
  }
  return metrics;
}

function parseValue(text) {
  if (text === '+Inf' || text === 'Inf') return Infinity;
  if (text === '-Inf') return -Infinity;
  const value = Number(text);
  return Number.isNaN(value) && text !== 'NaN' ? null : value;
}

function parseLabels(text) {
  const labels = {};
  for (const [, name, value] of text.matchAll(/([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"/g)) {
    labels[name] = value.replace(/\\(.)/g, (_, c) => (c === 'n' ? '\n' : c));
  }
  return labels;
}

/** A metric's samples, whether or not the counter's name carries `_total`. */
function samplesOf(metrics, name) {
  const base = name.replace(/_total$/, '');
  return metrics.get(name) ?? metrics.get(`${base}_total`) ?? metrics.get(base) ?? null;
}

/** The sum over all labels, or null when the metric is absent. */
function total(metrics, name) {
  const samples = samplesOf(metrics, name);
  return samples ? samples.reduce((sum, s) => sum + s.value, 0) : null;
}

const FIGURES = [
  { id: 'connections', label: 'Open streams', gauge: 'eventrelay_sse_connections' },
  { id: 'relayed', label: 'Events relayed', unit: '/s', counter: 'eventrelay_events_relayed_total' },
  { id: 'published', label: 'Events published', unit: '/s', counter: 'eventrelay_events_published_total' },
  { id: 'deliveries', label: 'Webhook deliveries', unit: '/s', counter: 'eventrelay_webhook_deliveries_total' },
  {
    id: 'pool',
    label: 'Database pool in use',
    gauge: 'eventrelay_database_pool_in_use',
    suffix: (metrics) => ` / ${formatNumber(total(metrics, 'eventrelay_database_pool_size'))}`,
  },
  { id: 'pool-waiting', label: 'Waiting for a database connection', gauge: 'eventrelay_database_pool_waiting' },
  { id: 'mailbox', label: 'Largest actor mailbox', read: (metrics) => largest(metrics, 'eventrelay_actor_mailbox_depth') },
  { id: 'backlog', label: 'Webhook deliveries due', gauge: 'eventrelay_webhook_due_backlog' },
  { id: 'oldest-due', label: 'Oldest due delivery', unit: ' s', gauge: 'eventrelay_webhook_oldest_due_age_seconds' },
];

function largest(metrics, name) {
  const samples = samplesOf(metrics, name);
  return samples ? Math.max(0, ...samples.map((s) => s.value)) : null;
}

const live = { timer: null, previous: null, history: new Map(), reading: false };

function buildFigures() {
  const items = FIGURES.map(({ id, label }) => {
    const svg = document.createElementNS(SVG, 'svg');
    svg.setAttribute('class', 'spark');
    svg.setAttribute('viewBox', '0 0 160 40');
    svg.setAttribute('preserveAspectRatio', 'none');
    svg.setAttribute('role', 'img');
    svg.setAttribute('aria-label', `${label}: no reading yet`);
    const value = element('span', { className: 'number', text: '—' });
    const unit = element('span', { className: 'unit' });
    return element('li', { className: 'figure', attrs: { id: `figure-${id}` } }, [
      element('p', { className: 'figure-label', text: label }),
      element('p', { className: 'figure-value' }, [value, unit]),
      svg,
    ]);
  });
  $('figures').replaceChildren(...items);
}

/** Each figure's value from this reading and the last (for rates). */
function readFigures(metrics, at) {
  const previous = live.previous;
  const values = {};
  for (const figure of FIGURES) {
    if (figure.counter) {
      const now = total(metrics, figure.counter) ?? 0;
      const before = previous ? total(previous.metrics, figure.counter) ?? 0 : null;
      const seconds = previous ? (at - previous.at) / 1000 : 0;
      values[figure.id] = before === null || seconds <= 0 || now < before ? null : (now - before) / seconds;
    } else if (figure.read) {
      values[figure.id] = figure.read(metrics);
    } else {
      values[figure.id] = total(metrics, figure.gauge);
    }
  }
  return values;
}

function showFigures(metrics, values) {
  for (const figure of FIGURES) {
    const history = live.history.get(figure.id) ?? [];
    history.push(values[figure.id]);
    while (history.length > SAMPLES) history.shift();
    live.history.set(figure.id, history);
    const item = $(`figure-${figure.id}`);
    const value = values[figure.id];
    item.dataset.value = value === null ? '' : String(value);
    item.querySelector('.number').textContent = formatNumber(value);
    const suffix = figure.suffix?.(metrics) ?? '';
    item.querySelector('.unit').textContent = value === null ? '' : `${suffix}${figure.unit ?? ''}`;
    drawSparkline(item.querySelector('svg'), history, figure.label);
  }
}

/** Draws `values` (nulls are gaps) as a line over a filled area, across the width, scaled from 0. */
function drawSparkline(svg, values, label) {
  const width = 160;
  const height = 40;
  const known = values.filter((v) => v !== null && Number.isFinite(v));
  const top = Math.max(...known, 0) || 1;
  const x = (i) => (values.length === 1 ? width : i * (width / (values.length - 1)));
  const y = (v) => height - 2 - (v / top) * (height - 4);
  const segments = [];
  let current = [];
  values.forEach((v, i) => {
    if (v === null || !Number.isFinite(v)) {
      if (current.length) segments.push(current);
      current = [];
    } else current.push([x(i), y(v)]);
  });
  if (current.length) segments.push(current);
  const shapes = [];
  for (const points of segments) {
    const line = points.map(([px, py]) => `${px.toFixed(1)},${py.toFixed(1)}`).join(' ');
    const first = points[0][0].toFixed(1);
    const last = points.at(-1)[0].toFixed(1);
    shapes.push(svgNode('polygon', { class: 'spark-area', points: `${first},${height} ${line} ${last},${height}` }));
    shapes.push(svgNode('polyline', { class: 'spark-line', points: points.length === 1 ? `${line} ${line}` : line }));
  }
  svg.replaceChildren(svgNode('line', { class: 'spark-base', x1: 0, y1: height - 0.5, x2: width, y2: height - 0.5 }), ...shapes);
  svg.setAttribute('aria-label', known.length
    ? `${label}: last ${known.length} readings, from ${formatNumber(Math.min(...known))} to ${formatNumber(Math.max(...known))}`
    : `${label}: no reading yet`);
}

function svgNode(name, attrs) {
  const node = document.createElementNS(SVG, name);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, String(value));
  return node;
}

function showMailboxes(metrics) {
  const samples = samplesOf(metrics, 'eventrelay_actor_mailbox_depth') ?? [];
  const rows = samples
    .map((s) => ({ actor: s.labels.actor ?? '(no label)', depth: s.value }))
    .sort((a, b) => b.depth - a.depth || a.actor.localeCompare(b.actor))
    .map(({ actor, depth }) => element('tr', {}, [
      element('th', { className: 'mono', text: actor, attrs: { scope: 'row' } }),
      cell(formatNumber(depth), 'num'),
    ]));
  $('mailboxes-body').replaceChildren(...rows);
}

async function readMetrics() {
  let response;
  try {
    response = await fetch('/metrics', { cache: 'no-store', credentials: 'omit' });
  } catch {
    throw new Error('The relay could not be reached for its metrics: check that it is running.');
  }
  if (!response.ok) throw new Error(`The metrics could not be read: the relay answered ${response.status}.`);
  return parseMetrics(await response.text());
}

async function refreshMetrics() {
  const at = Date.now();
  const metrics = await readMetrics();
  const values = readFigures(metrics, at);
  live.previous = { metrics, at };
  showFigures(metrics, values);
  showMailboxes(metrics);
  $('live-updated').textContent = `Updated ${new Date(at).toLocaleTimeString()}`;
}

async function refreshScopes() {
  const { scopes, streams, relay } = await api('GET', '/v1/admin/scopes?limit=10');
  showRelayName(relay);
  $('scopes-summary').textContent = `${formatNumber(streams)} open ${streams === 1 ? 'stream' : 'streams'} on relay ${relay}.`;
  const rows = scopes.map((s) => element('tr', {}, [
    element('th', { className: 'mono', text: s.scopeKey, attrs: { scope: 'row' } }),
    cell(formatNumber(s.streams), 'num'),
  ]));
  $('scopes-body').replaceChildren(...rows);
  showEmpty('scopes-empty', rows.length === 0);
}

/** One reading: the metrics always (so the charts have a history), the scopes on the Live page. */
async function liveTick() {
  if (live.reading || !adminToken() || document.hidden) return;
  live.reading = true;
  try {
    await refreshMetrics();
    if (currentView() === 'live') await refreshScopes();
    clearError('live');
  } catch (error) {
    report(error, 'live');
  } finally {
    live.reading = false;
  }
}

function startLive() {
  if (live.timer) return;
  liveTick();
  live.timer = setInterval(liveTick, METRICS_EVERY_MS);
}

function stopLive() {
  clearInterval(live.timer);
  live.timer = null;
  live.previous = null;
  live.history.clear();
}

// ---------------------------------------------------------------------------
// Streams

const streams = { next: null, shown: 0 };

async function loadStreams({ more = false } = {}) {
  const scope = $('streams-scope').value.trim();
  const after = more ? streams.next : null;
  const page = await api('GET', `/v1/admin/subscribers${query({ limit: STREAMS_PAGE, after, scope })}`);
  const rows = page.streams.map(streamRow);
  if (more) $('streams-body').append(...rows);
  else keepingFocus($('streams-body'), () => $('streams-body').replaceChildren(...rows));
  streams.next = page.next;
  streams.shown = $('streams-body').rows.length;
  $('streams-more').hidden = page.next === null;
  showEmpty('streams-empty', streams.shown === 0);
  $('streams-count').textContent = `${streams.shown} ${streams.shown === 1 ? 'stream' : 'streams'} shown${page.next === null ? '' : ', more behind'}`;
  if (page.streams[0]) showRelayName(page.streams[0].relay);
}

function streamRow(stream) {
  const tr = element('tr');
  tr.dataset.streamId = stream.id;
  tr.dataset.subscriber = stream.subscriber;
  // A stream of several scopes is disconnected in all of them: a scope of
  // its own would take only that one out of it.
  const scopes = stream.scopes ?? [stream.scopeKey];
  if (scopes.length === 1) tr.dataset.scope = scopes[0];
  const disconnect = button('Disconnect', {
    action: 'disconnect',
    id: stream.id,
    ariaLabel: `Disconnect ${stream.subscriber} from ${scopes.length === 1 ? scopes[0] : 'every scope'}`,
    className: 'danger',
  });
  tr.append(
    element('th', { className: 'num', text: stream.id, attrs: { scope: 'row' } }),
    cell(stream.subscriber, 'mono'),
    cell(scopes.join(', '), 'mono'),
    cell(timeNode(stream.connectedAt)),
    cell(stream.relay, 'mono'),
    cell(disconnect, 'actions'),
  );
  return tr;
}

function onStreamAction(event) {
  const target = event.target.closest('button[data-action="disconnect"]');
  if (!target) return;
  const row = target.closest('tr');
  const { subscriber, scope } = row.dataset;
  return confirmFirst(target, 'Confirm disconnect', () => disconnect(subscriber, scope));
}

async function disconnect(subscriber, scope) {
  const path = `/v1/admin/subscribers/${encodeURIComponent(subscriber)}/disconnect${query({ scope })}`;
  const answer = await api('POST', path);
  const count = answer.disconnected;
  say(`Ended ${count} ${count === 1 ? 'stream' : 'streams'} of ${answer.subscriber} in ${answer.scopeKey ?? 'every scope'} on relay ${answer.relay}.`);
  await loadStreams();
  $('streams-title').focus();
}

// ---------------------------------------------------------------------------
// Signing in and out, routing

function currentView() {
  const name = location.hash.slice(1);
  return VIEWS.includes(name) ? name : 'webhooks';
}

/** Names the relay this page talks to, in the header (a failure here is not worth an alert). */
async function loadRelayName() {
  try {
    showRelayName((await api('GET', '/v1/admin/scopes?limit=1')).relay);
  } catch {}
}

function showRelayName(relay) {
  if (relay) $('relay-name').textContent = `relay ${relay}`;
}

/** Shows the sign-in form or the current section, and loads what it shows. */
function route({ focus = false } = {}) {
  const signedIn = Boolean(adminToken());
  $('nav').hidden = !signedIn;
  $('session').hidden = !signedIn;
  $('view-signin').hidden = signedIn;
  const view = signedIn ? currentView() : null;
  for (const name of VIEWS) $(`view-${name}`).hidden = name !== view;
  for (const link of $('nav').querySelectorAll('a')) {
    if (link.dataset.view === view) link.setAttribute('aria-current', 'page');
    else link.removeAttribute('aria-current');
  }
  if (!signedIn) {
    document.title = 'Sign in · eventrelay console';
    stopLive();
    if (focus) $('signin-token').focus();
    return;
  }
  document.title = `${view[0].toUpperCase()}${view.slice(1)} · eventrelay console`;
  if (!$('relay-name').textContent) loadRelayName();
  startLive();
  if (focus) {
    say('');
    $(`${view}-title`).focus();
  }
  act(null, () => enter(view));
}

function enter(view) {
  if (view === 'webhooks') return loadWebhooks().then(() => pollDelivery());
  if (view === 'live') return liveTick();
  return loadStreams();
}

async function signIn(event) {
  event.preventDefault();
  const candidate = $('signin-token').value.trim();
  await act(event.submitter, async () => {
    if (!candidate) throw new Error('Enter the admin token.');
    await api('GET', '/v1/admin/subscriptions', undefined, { token: candidate });
    sessionStorage.setItem(TOKEN_KEY, candidate);
    $('signin-token').value = '';
    route({ focus: true });
    say('Signed in.');
  });
  if (!adminToken()) $('signin-token').select();
}

function signOut() {
  sessionStorage.removeItem(TOKEN_KEY);
  clearTimeout(webhooks.deliveryTimer);
  webhooks.delivery = null;
  $('delivery').hidden = true;
  $('secret-value').textContent = '';
  $('secret-box').hidden = true;
  $('relay-name').textContent = '';
  for (const body of ['subscriptions-body', 'log-body', 'attempts-body', 'streams-body', 'scopes-body']) $(body).replaceChildren();
  route({ focus: true });
  say('Signed out.');
}

function wire() {
  $('signin-form').addEventListener('submit', signIn);
  $('sign-out').addEventListener('click', () => {
    clearError();
    signOut();
  });
  $('alert-dismiss').addEventListener('click', () => clearError());
  window.addEventListener('hashchange', () => route({ focus: true }));
  document.addEventListener('visibilitychange', () => {
    if (!document.hidden) liveTick();
  });

  $('subscriptions-refresh').addEventListener('click', (e) => act(e.currentTarget, loadSubscriptions));
  $('subscriptions-body').addEventListener('click', onSubscriptionAction);
  $('secret-copy').addEventListener('click', copySecret);
  $('secret-dismiss').addEventListener('click', dismissSecret);
  $('redeliver-failed-form').addEventListener('submit', redeliverFailed);
  $('redeliver-failed-cancel').addEventListener('click', closeRedeliverFailed);
  $('create-form').addEventListener('submit', createSubscription);

  // Applying the filters or going back to the newest page also refreshes
  // the subscriptions' health, which the same deliveries change.
  const newest = () => Promise.all([loadLog({ before: null }), loadSubscriptions()]);
  $('log-filter').addEventListener('submit', (e) => {
    e.preventDefault();
    act(e.submitter, newest);
  });
  $('log-clear').addEventListener('click', (e) => {
    $('log-filter').reset();
    act(e.currentTarget, () => loadLog({ before: null }));
  });
  $('log-newest').addEventListener('click', (e) => act(e.currentTarget, newest));
  $('log-older').addEventListener('click', (e) => act(e.currentTarget, () => loadLog({ before: webhooks.log.nextBefore })));
  $('log-body').addEventListener('click', onLogClick);

  $('delivery-redeliver').addEventListener('click', (e) => act(e.currentTarget, redeliver));
  $('delivery-refresh').addEventListener('click', (e) => act(e.currentTarget, () => openDelivery(webhooks.delivery.id)));
  $('delivery-close').addEventListener('click', closeDelivery);

  $('streams-filter').addEventListener('submit', (e) => {
    e.preventDefault();
    act(e.submitter, () => loadStreams());
  });
  $('streams-more').addEventListener('click', (e) => act(e.currentTarget, () => loadStreams({ more: true })));
  $('streams-body').addEventListener('click', onStreamAction);
}

buildFigures();
wire();
route();
