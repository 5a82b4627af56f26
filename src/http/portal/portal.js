// The customer portal's behaviour: exchanging the link's one-time code for
// a session token, the theme, and one scope's endpoints and deliveries
// through /v1/portal. The token is kept in this tab's sessionStorage only
// (partitioned by the embedding site, never in a URL or a cookie); the
// code is taken out of the address bar before anything else happens.

import {
  $, act, api, authenticate, badge, button, cell, clearError, confirmFirst, element,
  fromLocalInput, keepingFocus, say, showEmpty, showError, timeNode, toLocalInput,
} from './ui.js';

const TOKEN_KEY = 'eventrelay.portalToken';
const DELIVERIES_PAGE = 50;

const portal = { session: null, endpoints: [], types: [], editing: null, delivery: null };

function portalToken() {
  return sessionStorage.getItem(TOKEN_KEY);
}

// A refused token means the session ended: the page closes.
authenticate({
  token: portalToken,
  refused(error) {
    close(error.message);
    return true;
  },
});

const path = (...parts) => `/v1/portal/${parts.map(encodeURIComponent).join('/')}`;

// ---------------------------------------------------------------------------
// The session

async function open() {
  const code = new URLSearchParams(location.hash.slice(1)).get('code');
  if (code) {
    // Out of the address bar (and the tab's history) before any request.
    history.replaceState(null, '', location.pathname);
    try {
      const { token } = await api('POST', path('exchange'), { code }, { token: '' });
      sessionStorage.setItem(TOKEN_KEY, token);
    } catch (error) {
      close(error.message);
      return;
    }
  }
  if (!portalToken()) {
    close('This page needs a link from the application. Open the webhooks page there again.');
    return;
  }
  try {
    portal.session = (await api('GET', path('session'))).session;
  } catch (error) {
    if (portalToken()) close(error.message);
    return;
  }
  applyTheme(portal.session.theme);
  $('scope-name').textContent = portal.session.scopeKey;
  $('session-ends').textContent = `Session ends ${new Date(portal.session.expiresAt).toLocaleString()}`;
  $('session').hidden = false;
  $('view-closed').hidden = true;
  $('view-portal').hidden = false;
  await Promise.all([loadTypes(), loadEndpoints()]);
  await loadDeliveries();
}

function close(message) {
  sessionStorage.removeItem(TOKEN_KEY);
  $('view-portal').hidden = true;
  $('session').hidden = true;
  $('closed-text').textContent = message;
  $('view-closed').hidden = false;
  $('closed-title').focus();
}

/** The theme given at minting: CSS variables the server has checked. */
function applyTheme(theme) {
  const root = document.documentElement.style;
  if (theme?.accent) {
    root.setProperty('--accent', theme.accent);
    root.setProperty('--focus', theme.accent);
  }
  if (theme?.font) root.setProperty('font-family', theme.font);
}

// ---------------------------------------------------------------------------
// Endpoints

async function loadTypes() {
  const { eventTypes } = await api('GET', path('event-types'));
  portal.types = eventTypes.map((entry) => entry.type);
  const list = $('endpoint-types');
  list.replaceChildren(...portal.types.map((type) => {
    const box = element('input', { attrs: { type: 'checkbox', value: type, name: 'types' } });
    return element('label', { className: 'check' }, [box, ` ${type}`]);
  }));
  syncTypeBoxes();
}

async function loadEndpoints() {
  portal.endpoints = (await api('GET', path('subscriptions'))).subscriptions;
  keepingFocus($('endpoints-body'), () => {
    $('endpoints-body').replaceChildren(...portal.endpoints.map(endpointRow));
  });
  showEmpty('endpoints-empty', portal.endpoints.length === 0);
  const select = $('deliveries-endpoint');
  const chosen = select.value;
  select.replaceChildren(element('option', { text: 'All endpoints', attrs: { value: '' } }),
    ...portal.endpoints.map((e) => element('option', { text: e.url, attrs: { value: e.id } })));
  select.value = portal.endpoints.some((e) => e.id === chosen) ? chosen : '';
}

function endpointRow(endpoint) {
  const state = endpoint.pausedAt
    ? badge(endpoint.pausedReason === 'failing' ? 'paused: failing' : 'paused', 'warn')
    : badge('active', 'ok');
  const paused = Boolean(endpoint.pausedAt);
  const actions = element('div', { className: 'row-actions' }, [
    button('Edit', { action: 'edit', id: endpoint.id, ariaLabel: `Edit ${endpoint.url}` }),
    button('Send test', { action: 'test', id: endpoint.id, ariaLabel: `Send a test event to ${endpoint.url}` }),
    button(paused ? 'Resume' : 'Pause', { action: paused ? 'resume' : 'pause', slot: 'pause', id: endpoint.id }),
    button('Rotate secret', { action: 'rotate', id: endpoint.id }),
    button('Deliveries', { action: 'deliveries', id: endpoint.id }),
    button('Delete', { action: 'delete', id: endpoint.id, className: 'danger', ariaLabel: `Delete ${endpoint.url}` }),
  ]);
  return element('tr', {}, [
    cell(endpoint.url, 'url'),
    cell(endpoint.types.join(', ')),
    cell(state),
    cell(actions),
  ]);
}

async function onEndpointAction(event) {
  const target = event.target.closest('button[data-action]');
  if (!target) return;
  const id = target.dataset.id;
  const endpoint = portal.endpoints.find((e) => e.id === id);
  const actions = {
    edit: () => startEditing(endpoint),
    test: () => act(target, () => sendTest(id)),
    pause: () => act(target, () => setPaused(id, true)),
    resume: () => act(target, () => setPaused(id, false)),
    rotate: () => confirmFirst(target, 'Confirm rotation', () => rotate(id)),
    deliveries: () => act(target, () => deliveriesOf(id)),
    delete: () => confirmFirst(target, 'Confirm delete', () => remove(id)),
  };
  await actions[target.dataset.action]?.();
}

function chosenTypes() {
  if ($('endpoint-all').checked) return ['*'];
  return [...$('endpoint-types').querySelectorAll('input:checked')].map((box) => box.value);
}

function syncTypeBoxes() {
  const all = $('endpoint-all').checked;
  for (const box of $('endpoint-types').querySelectorAll('input')) box.disabled = all;
}

function startEditing(endpoint) {
  portal.editing = endpoint.id;
  $('endpoint-form-title').textContent = 'Change the endpoint';
  $('endpoint-submit').textContent = 'Save';
  $('endpoint-cancel').hidden = false;
  $('endpoint-url').value = endpoint.url;
  $('endpoint-all').checked = endpoint.types.includes('*');
  for (const box of $('endpoint-types').querySelectorAll('input')) box.checked = endpoint.types.includes(box.value);
  syncTypeBoxes();
  $('endpoint-url').focus();
}

function stopEditing() {
  portal.editing = null;
  $('endpoint-form').reset();
  $('endpoint-form-title').textContent = 'Add an endpoint';
  $('endpoint-submit').textContent = 'Add endpoint';
  $('endpoint-cancel').hidden = true;
  syncTypeBoxes();
}

async function saveEndpoint(event) {
  event.preventDefault();
  const body = { url: $('endpoint-url').value.trim(), types: chosenTypes() };
  if (!body.url) {
    showError('Enter the URL your server receives webhooks at.');
    $('endpoint-url').focus();
    return;
  }
  if (body.types.length === 0) {
    showError('Choose at least one event, or all events.');
    return;
  }
  await act($('endpoint-submit'), async () => {
    if (portal.editing) {
      await api('PATCH', path('subscriptions', portal.editing), body);
      say('Endpoint saved.');
    } else {
      const { subscription, secret } = await api('POST', path('subscriptions'), body);
      showSecret(subscription.url, secret);
      say('Endpoint added.');
    }
    stopEditing();
    await loadEndpoints();
  });
}

async function sendTest(id) {
  const { delivery } = await api('POST', path('subscriptions', id, 'test'));
  say('Test event sent.');
  $('deliveries-endpoint').value = id;
  await loadDeliveries();
  await showDelivery(delivery.id);
}

async function setPaused(id, paused) {
  await api('POST', path('subscriptions', id, paused ? 'pause' : 'resume'));
  say(paused ? 'Endpoint paused: deliveries wait until you resume it.' : 'Endpoint resumed.');
  await loadEndpoints();
}

async function rotate(id) {
  const answer = await api('POST', path('subscriptions', id, 'rotate-secret'));
  showSecret(answer.subscription.url, answer.secret,
    ` The old secret also signs until ${new Date(answer.previousSecretExpiresAt).toLocaleString()}.`);
}

async function remove(id) {
  await api('DELETE', path('subscriptions', id));
  say('Endpoint deleted.');
  await loadEndpoints();
  await loadDeliveries();
}

function showSecret(url, secret, extra = '') {
  $('secret-endpoint').textContent = url;
  $('secret-value').textContent = secret;
  $('secret-box').hidden = false;
  $('secret-box').focus();
  if (extra) say(extra.trim());
}

// ---------------------------------------------------------------------------
// Deliveries

async function deliveriesOf(id) {
  $('deliveries-endpoint').value = id;
  await loadDeliveries();
  $('deliveries-title').focus();
}

async function loadDeliveries() {
  const subscriptionId = $('deliveries-endpoint').value;
  const query = new URLSearchParams({ limit: String(DELIVERIES_PAGE) });
  if (subscriptionId) query.set('subscriptionId', subscriptionId);
  const { deliveries } = await api('GET', `${path('deliveries')}?${query}`);
  keepingFocus($('deliveries-body'), () => {
    $('deliveries-body').replaceChildren(...deliveries.map(deliveryRow));
  });
  showEmpty('deliveries-empty', deliveries.length === 0);
  $('redeliver-failed-form').hidden = !subscriptionId;
  if (!$('redeliver-failed-since').value) {
    $('redeliver-failed-since').value = toLocalInput(new Date(Date.now() - 24 * 3600 * 1000));
  }
}

const STATUS_KINDS = { delivered: 'ok', pending: 'neutral', dead: 'bad', gone: 'warn' };

function deliveryRow(delivery) {
  const open = button(delivery.eventType, {
    action: 'show', id: delivery.id, className: 'link',
    ariaLabel: `Show delivery ${delivery.id} of ${delivery.eventType}`,
  });
  return element('tr', {}, [
    cell(timeNode(delivery.createdAt)),
    cell(open),
    cell(badge(delivery.status, STATUS_KINDS[delivery.status] ?? 'neutral')),
    cell(delivery.attempts, 'num'),
    cell(delivery.lastStatus ?? delivery.lastError),
  ]);
}

async function showDelivery(id) {
  const { delivery, attempts } = await api('GET', path('deliveries', String(id)));
  portal.delivery = delivery.id;
  $('delivery-title').textContent = `Delivery ${delivery.id}: ${delivery.eventType}, ${delivery.status}`;
  $('attempts-body').replaceChildren(...attempts.map((attempt) => element('tr', {}, [
    cell(attempt.attempt, 'num'),
    cell(timeNode(attempt.startedAt)),
    cell(`${attempt.durationMs} ms`, 'num'),
    cell(attempt.statusCode),
    cell(attempt.outcome),
    cell(attempt.response ?? attempt.error, 'answer'),
  ])));
  $('delivery-detail').hidden = false;
  $('delivery-detail').focus();
}

async function redeliverShown() {
  await api('POST', path('deliveries', String(portal.delivery), 'redeliver'));
  say('Delivery queued again.');
  await loadDeliveries();
  await showDelivery(portal.delivery);
}

async function redeliverFailed(event) {
  event.preventDefault();
  const since = fromLocalInput($('redeliver-failed-since').value);
  if (!since) {
    showError('Enter the time from which failed deliveries are sent again.');
    return;
  }
  const id = $('deliveries-endpoint').value;
  await act(event.submitter, async () => {
    const { redelivered } = await api('POST', path('subscriptions', id, 'redeliver-failed'), { since });
    say(`${redelivered} failed ${redelivered === 1 ? 'delivery' : 'deliveries'} queued again.`);
    await loadDeliveries();
  });
}

// ---------------------------------------------------------------------------
// Wiring

$('endpoints-body').addEventListener('click', onEndpointAction);
$('endpoints-refresh').addEventListener('click', (e) => act(e.currentTarget, loadEndpoints));
$('endpoint-form').addEventListener('submit', saveEndpoint);
$('endpoint-cancel').addEventListener('click', stopEditing);
$('endpoint-all').addEventListener('change', syncTypeBoxes);
$('secret-dismiss').addEventListener('click', () => {
  $('secret-value').textContent = '';
  $('secret-box').hidden = true;
});
$('secret-copy').addEventListener('click', (e) => act(e.currentTarget, async () => {
  await navigator.clipboard.writeText($('secret-value').textContent);
  say('Secret copied.');
}));
$('deliveries-endpoint').addEventListener('change', () => act(null, loadDeliveries));
$('deliveries-refresh').addEventListener('click', (e) => act(e.currentTarget, loadDeliveries));
$('deliveries-body').addEventListener('click', (event) => {
  const target = event.target.closest('button[data-action="show"]');
  if (target) act(target, () => showDelivery(target.dataset.id));
});
$('delivery-redeliver').addEventListener('click', (e) => act(e.currentTarget, redeliverShown));
$('redeliver-failed-form').addEventListener('submit', redeliverFailed);
$('alert-dismiss').addEventListener('click', () => clearError());

open();
