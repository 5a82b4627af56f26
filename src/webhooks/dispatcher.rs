//! The webhook dispatcher: a pool of workers that claim due deliveries,
//! send them signed, and record what happened.
//!
//! Safe with any number of replicas: a claim leases one row with
//! `FOR UPDATE SKIP LOCKED`, and the lease (longer than the request timeout)
//! keeps every other worker away until the attempt is recorded or the lease
//! runs out, after which the delivery is sent again (at least once). Workers
//! sleep until the next delivery falls due, and are woken at once when a
//! durable event commits (the listener sees its pointer) or a delivery is
//! redelivered.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::{Actor, ActorContext, AsyncContext, Context, WrapFuture};
use chrono::Utc;
use eventrelay_wire::EventEnvelope;
use eventrelay_wire::webhook::{WebhookSecret, sign};
use opentelemetry::KeyValue;
use reqwest::header::{CONTENT_TYPE, HeaderMap, RETRY_AFTER};
use tokio::sync::mpsc;

use super::model::{
    AttemptOutcome, AttemptRecord, Claimed, MAX_RESPONSE_BYTES, PauseRule, Recorded,
};
use super::settings::{MIN_RETRY_AFTER, WebhooksConfig};
use super::store::WebhookStore;
use crate::metrics::{ActorKind, Metrics, OutcomeLabel};
use crate::store::{Database, StoreError};

/// Longest a worker sleeps without looking, in case a wake-up was missed.
const IDLE_POLL: Duration = Duration::from_secs(30);
/// The same while the relay has no live LISTEN connection: no wake-up can
/// arrive then, and deliveries must not wait for the connection to return.
const DEAF_POLL: Duration = Duration::from_secs(1);
/// Wait after a database error before claiming again.
const ERROR_PAUSE: Duration = Duration::from_secs(1);
/// Longest error text kept with an attempt.
const MAX_ERROR_CHARS: usize = 500;

/// How workers learn that deliveries may be due: the dispatcher's
/// [`DeliveriesDue`] handler puts a wake-up in one channel all workers
/// read, and one of them takes it (a wake-up sent while every worker is
/// busy waits there, so none is missed; several coalesce into one). The
/// dispatcher holds the only sender: when it stops, the channel closes and
/// every worker ends. While the relay's LISTEN connection is down
/// (`listening` false) no wake-up can come, so workers look much more
/// often.
#[derive(Clone)]
struct WakeUps {
    /// For a worker that found a delivery to wake the next; weak, so the
    /// workers never hold their own channel open.
    due: mpsc::WeakSender<()>,
    inbox: Arc<tokio::sync::Mutex<mpsc::Receiver<()>>>,
    listening: Arc<std::sync::atomic::AtomicBool>,
}

impl WakeUps {
    /// Waits for a wake-up; false once the dispatcher has gone.
    async fn woken(&self) -> bool {
        self.inbox.lock().await.recv().await.is_some()
    }

    fn wake_another(&self) {
        if let Some(due) = self.due.upgrade() {
            let _ = due.try_send(());
        }
    }
}

pub struct Dispatcher {
    db: Database,
    store: WebhookStore,
    config: Arc<WebhooksConfig>,
    wake: WakeUps,
    /// The one strong sender of the workers' wake-up channel.
    due: mpsc::Sender<()>,
    metrics: Arc<Metrics>,
    http: reqwest::Client,
    /// One lifeline per running worker: a worker whose sender is dropped
    /// finishes its delivery, then ends.
    workers: Vec<mpsc::Sender<()>>,
    /// Dropped with the dispatcher once it has stopped: shutdown waits for
    /// that.
    _running: tokio::sync::mpsc::Sender<()>,
}

impl Dispatcher {
    pub fn new(
        db: Database,
        store: WebhookStore,
        config: WebhooksConfig,
        listening: Arc<std::sync::atomic::AtomicBool>,
        metrics: Arc<Metrics>,
        running: tokio::sync::mpsc::Sender<()>,
    ) -> Result<Self, reqwest::Error> {
        let http = build_client(&config)?;
        let (due, inbox) = mpsc::channel(1);
        Ok(Dispatcher {
            db,
            store,
            config: Arc::new(config),
            wake: WakeUps {
                due: due.downgrade(),
                inbox: Arc::new(tokio::sync::Mutex::new(inbox)),
                listening,
            },
            due,
            metrics,
            http,
            workers: Vec::new(),
            _running: running,
        })
    }
}

/// The HTTP client: no redirects, a whole-request timeout, and (unless
/// allowed) a resolver that refuses internal addresses after DNS.
fn build_client(config: &WebhooksConfig) -> Result<reqwest::Client, reqwest::Error> {
    let mut builder = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_millis(config.request_timeout_ms))
        .user_agent(concat!("eventrelay/", env!("CARGO_PKG_VERSION")))
        .no_proxy();
    if !config.allow_private_networks {
        builder = builder.dns_resolver(Arc::new(PublicOnlyResolver));
    }
    builder.build()
}

impl Actor for Dispatcher {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        self.resize(self.config.workers);
        let watch = watch_backlog(
            self.db.clone(),
            self.store.clone(),
            Arc::clone(&self.metrics),
        );
        ctx.spawn(watch.into_actor(self));
    }
}

/// How often the due backlog is measured.
const BACKLOG_EVERY: Duration = Duration::from_secs(5);

/// Keeps the backlog gauges current: how many deliveries are due and not
/// being sent, and how long the oldest has waited. A backlog that grows
/// while every worker is busy means `webhooks.workers` is too small.
async fn watch_backlog(db: Database, store: WebhookStore, metrics: Arc<Metrics>) {
    let mut ticks = tokio::time::interval(BACKLOG_EVERY);
    loop {
        ticks.tick().await;
        let backlog: Result<_, StoreError> = async {
            let conn = db.get().await?;
            store.due_backlog(&conn).await
        }
        .await;
        match backlog {
            Ok((due, oldest)) => {
                metrics.webhook_due_backlog.set(due);
                metrics.webhook_oldest_due_age_seconds.set(oldest);
            }
            Err(error) => tracing::debug!(%error, "cannot measure the webhook backlog"),
        }
    }
}

impl Dispatcher {
    /// Runs `workers` workers: starts more, or lets the surplus finish
    /// their delivery and end.
    fn resize(&mut self, workers: usize) {
        // A dropped lifeline ends its worker after its delivery.
        self.workers.truncate(workers);
        while self.workers.len() < workers {
            let (lifeline, retired) = mpsc::channel(1);
            let work = Worker {
                db: self.db.clone(),
                store: self.store.clone(),
                config: Arc::clone(&self.config),
                wake: self.wake.clone(),
                metrics: Arc::clone(&self.metrics),
                http: self.http.clone(),
                retired,
                _running: self._running.clone(),
            };
            let worker = self.workers.len();
            // Not in the actor's context: stopping the dispatcher must not
            // drop a delivery mid-request, which would leave its lease to
            // run out (`lease_ms`) before anyone sends it again. A worker
            // ends once its lifeline is gone and its delivery is recorded.
            actix::spawn(work.run(worker));
            self.workers.push(lifeline);
        }
    }
}

/// Runs this many webhook workers (a reloaded `webhooks.workers`).
#[derive(actix::Message)]
#[rtype(result = "()")]
pub struct SetWorkers(pub usize);

impl actix::Handler<SetWorkers> for Dispatcher {
    type Result = ();

    fn handle(&mut self, msg: SetWorkers, _: &mut Context<Self>) {
        let _handling = self.metrics.actor(ActorKind::Dispatcher).handling();
        self.resize(msg.0);
    }
}

/// Deliveries may be due now: a durable event committed (the relay heard
/// its pointer) or a delivery was put back in the queue. Wakes one idle
/// worker to look; a worker that finds a delivery wakes the next before
/// delivering it, so a burst spreads over the workers while an event with
/// no webhook costs one look, not one per worker.
#[derive(actix::Message)]
#[rtype(result = "()")]
pub struct DeliveriesDue;

impl actix::Handler<DeliveriesDue> for Dispatcher {
    type Result = ();

    fn handle(&mut self, _: DeliveriesDue, _: &mut Context<Self>) {
        let _handling = self.metrics.actor(ActorKind::Dispatcher).handling();
        // Full means a wake-up is already waiting for a worker.
        let _ = self.due.try_send(());
    }
}

/// Stops the dispatcher and its workers. Dropping its address is not
/// enough: an actor with running futures outlives its addresses, which
/// would leak it when the relay runs inside an application.
#[derive(actix::Message)]
#[rtype(result = "()")]
pub struct StopDispatcher;

impl actix::Handler<StopDispatcher> for Dispatcher {
    type Result = ();

    fn handle(&mut self, _: StopDispatcher, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}

struct Worker {
    db: Database,
    store: WebhookStore,
    config: Arc<WebhooksConfig>,
    wake: WakeUps,
    metrics: Arc<Metrics>,
    http: reqwest::Client,
    /// Never sent on: it closes when the dispatcher drops this worker's
    /// lifeline (fewer workers configured) or stops.
    retired: mpsc::Receiver<()>,
    /// Held until the worker ends, so that shutdown waits for the delivery
    /// it is sending to be recorded.
    _running: tokio::sync::mpsc::Sender<()>,
}

impl Worker {
    async fn run(mut self, worker: usize) {
        let lease = Duration::from_millis(self.config.lease_ms);
        loop {
            if self.retired.is_closed() {
                tracing::debug!(worker, "webhook worker stopped");
                return;
            }
            let claimed: Result<_, StoreError> = async {
                let conn = self.db.get().await?;
                self.store.claim(&conn, lease).await
            }
            .await;
            match claimed {
                Ok(Some(claimed)) => {
                    // There may be more: let another worker look.
                    self.wake.wake_another();
                    if claimed.skipped_ahead {
                        self.metrics.webhook_order_skips.inc();
                    }
                    self.metrics.webhook_workers_busy.inc();
                    self.deliver(claimed).await;
                    self.metrics.webhook_workers_busy.dec();
                    // Settled, it may have been its key's head: the next
                    // of the key is due now.
                    self.wake.wake_another();
                }
                Ok(None) => {
                    let pause = self.until_next_due().await;
                    let until = tokio::time::Instant::now() + pause;
                    // In steps, so a LISTEN connection lost meanwhile turns
                    // a long wait into frequent looks.
                    loop {
                        let step = until
                            .saturating_duration_since(tokio::time::Instant::now())
                            .min(DEAF_POLL);
                        tokio::select! {
                            woken = self.wake.woken() => {
                                if woken {
                                    break;
                                }
                                return; // the dispatcher has gone
                            }
                            _ = self.retired.recv() => break, // ends at the loop's top
                            _ = tokio::time::sleep(step) => {}
                        }
                        let listening = self
                            .wake
                            .listening
                            .load(std::sync::atomic::Ordering::Relaxed);
                        if tokio::time::Instant::now() >= until || !listening {
                            break;
                        }
                    }
                }
                Err(error) => {
                    tracing::warn!(worker, %error, "cannot claim webhook deliveries; retrying");
                    tokio::time::sleep(ERROR_PAUSE).await;
                }
            }
        }
    }

    async fn until_next_due(&self) -> Duration {
        let next = match self.db.get().await {
            Ok(conn) => self.store.next_due(&conn).await.ok().flatten(),
            Err(_) => None,
        };
        let longest = if self
            .wake
            .listening
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            IDLE_POLL
        } else {
            DEAF_POLL
        };
        match next {
            Some(at) => (at - Utc::now())
                .to_std()
                .unwrap_or(Duration::ZERO)
                .min(longest),
            None => longest,
        }
        .max(Duration::from_millis(5))
    }

    async fn deliver(&self, claimed: Claimed) {
        let started_at = Utc::now();
        let clock = Instant::now();
        let trace = self.metrics.tracing.webhook_attempt(
            claimed.traceparent.as_deref(),
            vec![
                KeyValue::new("eventrelay.subscription", claimed.subscription_id.clone()),
                KeyValue::new("eventrelay.delivery", claimed.id),
                KeyValue::new("eventrelay.attempt", i64::from(claimed.attempt)),
                KeyValue::new("eventrelay.event_id", claimed.event_id.to_string()),
            ],
        );
        let outcome = self.attempt(&claimed, trace.traceparent.as_deref()).await;
        let record = self.settle(&claimed, outcome, started_at, clock.elapsed());
        let mut attributes = vec![KeyValue::new("eventrelay.outcome", record.outcome.as_str())];
        if let Some(status) = record.status_code {
            attributes.push(KeyValue::new(
                "http.response.status_code",
                i64::from(status),
            ));
        }
        let failed = match record.outcome {
            AttemptOutcome::Delivered => None,
            _ => Some(record.error.as_deref().unwrap_or("the receiver refused it")),
        };
        trace.end(attributes, failed);
        self.metrics
            .webhook_deliveries
            .get_or_create(&OutcomeLabel {
                outcome: record.outcome.as_str(),
            })
            .inc();
        let rule = PauseRule {
            after: Duration::from_secs(self.config.disable_after_secs),
            attempts: i32::try_from(self.config.disable_after_attempts).unwrap_or(i32::MAX),
            events_scope: self.config.events_scope.clone(),
        };
        let recorded: Result<_, StoreError> = async {
            let conn = self.db.get().await?;
            self.store.record(&conn, &claimed, &record, &rule).await
        }
        .await;
        match recorded {
            Ok(Recorded {
                settled: true,
                paused,
            }) => {
                if paused {
                    self.metrics.webhook_subscriptions_paused.inc();
                    tracing::warn!(
                        subscription = claimed.subscription_id,
                        "paused a webhook subscription whose attempts have all failed for \
                         webhooks.disable_after_secs; resume it once its receiver is fixed"
                    );
                }
            }
            Ok(Recorded { settled: false, .. }) => tracing::warn!(
                delivery = claimed.id,
                "the lease ran out before the attempt was recorded; the delivery will be sent again"
            ),
            Err(error) => {
                tracing::warn!(delivery = claimed.id, %error, "cannot record a webhook attempt")
            }
        }
    }

    /// Sends one attempt and reports what the receiver said. The request
    /// carries `traceparent` when the event has a trace.
    async fn attempt(&self, claimed: &Claimed, traceparent: Option<&str>) -> Sent {
        let subscription = match self.db.get().await {
            Ok(conn) => {
                self.store
                    .get_subscription(&conn, &claimed.subscription_id)
                    .await
            }
            Err(e) => return Sent::Failed(format!("database unavailable: {e}")),
        };
        let subscription = match subscription {
            Ok(Some(subscription)) => subscription,
            Ok(None) => return Sent::SubscriptionGone,
            Err(e) => return Sent::Failed(format!("database unavailable: {e}")),
        };
        let body = webhook_body(&claimed.payload);
        let msg_id = claimed.event_id.to_string();
        let timestamp = Utc::now().timestamp();
        let mut signatures = Vec::new();
        for secret in subscription.signing_secrets(Utc::now()) {
            match WebhookSecret::parse(secret) {
                Ok(secret) => signatures.push(sign(&secret, &msg_id, timestamp, &body)),
                Err(e) => return Sent::Failed(format!("subscription secret is unusable: {e}")),
            }
        }
        if let Err(refusal) =
            check_literal_address(&subscription.url, self.config.allow_private_networks)
        {
            return Sent::Failed(refusal);
        }
        let mut request = self
            .http
            .post(&subscription.url)
            .header(CONTENT_TYPE, "application/json")
            .header("webhook-id", &msg_id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signatures.join(" "));
        if let Some(traceparent) = traceparent {
            request = request.header("traceparent", traceparent);
        }
        let response = request.body(body).send().await;
        match response {
            Ok(response) => {
                let status = response.status().as_u16();
                let retry_after = retry_after(response.headers());
                Sent::Answered {
                    status,
                    retry_after,
                    response: answer_start(response).await,
                }
            }
            Err(error) => Sent::Failed(describe(&error)),
        }
    }

    /// Turns what happened into the delivery's next state.
    fn settle(
        &self,
        claimed: &Claimed,
        sent: Sent,
        started_at: chrono::DateTime<Utc>,
        took: Duration,
    ) -> AttemptRecord {
        let schedule = &self.config.retry_schedule_ms;
        let retry_in = |wait: Option<Duration>| -> (AttemptOutcome, Option<chrono::DateTime<Utc>>) {
            let scheduled = schedule
                .get(claimed.attempt as usize - 1)
                .map(|ms| Duration::from_millis(*ms));
            match scheduled {
                None => (AttemptOutcome::Dead, None),
                Some(scheduled) => {
                    let wait = wait.unwrap_or(scheduled);
                    (
                        AttemptOutcome::Retry,
                        Some(Utc::now() + chrono::Duration::from_std(wait).unwrap_or_default()),
                    )
                }
            }
        };
        let response = match &sent {
            Sent::Answered { response, .. } => response.clone(),
            _ => None,
        };
        let (status_code, error, (outcome, next_attempt_at)) = match sent {
            Sent::Answered { status, .. } if (200..300).contains(&status) => {
                (Some(status), None, (AttemptOutcome::Delivered, None))
            }
            Sent::Answered { status: 410, .. } => (
                Some(410),
                Some("410 Gone: the receiver asked to stop".to_owned()),
                (AttemptOutcome::Gone, None),
            ),
            Sent::Answered {
                status,
                retry_after,
                ..
            } => {
                let honoured = match status {
                    // At least a second, so `Retry-After: 0` is no hot loop;
                    // at most the configured ceiling. (min/max, not clamp:
                    // clamp panics on a ceiling below the floor.)
                    429 | 503 => retry_after.map(|wait| {
                        wait.max(MIN_RETRY_AFTER)
                            .min(Duration::from_millis(self.config.max_retry_after_ms))
                    }),
                    _ => None,
                };
                let error = if (300..400).contains(&status) {
                    format!("redirect {status} (redirects are not followed)")
                } else {
                    format!("receiver answered {status}")
                };
                (Some(status), Some(error), retry_in(honoured))
            }
            Sent::SubscriptionGone => (
                None,
                Some("the subscription no longer exists".to_owned()),
                (AttemptOutcome::Gone, None),
            ),
            Sent::Failed(error) => (None, Some(error), retry_in(None)),
        };
        AttemptRecord {
            started_at,
            duration_ms: took.as_millis().min(i32::MAX as u128) as i32,
            status_code: status_code.map(i32::from),
            error: error.map(|e| e.chars().take(MAX_ERROR_CHARS).collect()),
            response,
            outcome,
            next_attempt_at,
        }
    }
}

enum Sent {
    Answered {
        status: u16,
        retry_after: Option<Duration>,
        /// The start of the body (see [`MAX_RESPONSE_BYTES`]).
        response: Option<String>,
    },
    SubscriptionGone,
    Failed(String),
}

/// The start of a receiver's answer, read up to [`MAX_RESPONSE_BYTES`] (the
/// rest is never read) and cut back to whole characters. `None` for an
/// empty body, or one that fails before a byte arrives.
async fn answer_start(mut response: reqwest::Response) -> Option<String> {
    let mut kept = Vec::new();
    while kept.len() < MAX_RESPONSE_BYTES {
        match response.chunk().await {
            Ok(Some(chunk)) => kept.extend_from_slice(&chunk),
            Ok(None) | Err(_) => break,
        }
    }
    kept.truncate(MAX_RESPONSE_BYTES);
    if kept.is_empty() {
        return None;
    }
    let text = String::from_utf8_lossy(&kept);
    // A character the cut split shows as U+FFFD at the end; drop it.
    let text = match std::str::from_utf8(&kept) {
        Err(e) if e.error_len().is_none() => String::from_utf8_lossy(&kept[..e.valid_up_to()]),
        _ => text,
    };
    Some(text.into_owned())
}

/// The body receivers get: the envelope without its audience, serialised the
/// way the rest of eventrelay writes envelopes.
fn webhook_body(payload: &serde_json::Value) -> Vec<u8> {
    match serde_json::from_value::<EventEnvelope>(payload.clone()) {
        Ok(mut envelope) => {
            envelope.audience = None;
            serde_json::to_vec(&envelope).unwrap_or_default()
        }
        Err(_) => payload.to_string().into_bytes(),
    }
}

/// `Retry-After` in seconds (the HTTP-date form is not honoured).
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?;
    value.trim().parse::<u64>().ok().map(Duration::from_secs)
}

/// What went wrong, as stored with the delivery and shown to operators:
/// the error and its causes, with the URL's credentials, query and
/// fragment left out (a subscription's URL may carry a token there).
fn describe(error: &reqwest::Error) -> String {
    if error.is_timeout() {
        return "timed out".to_owned();
    }
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    match error.url() {
        Some(url) => text.replace(url.as_str(), &url_fit_to_show(url)),
        None => text,
    }
}

/// `url` without user, password, query or fragment.
fn url_fit_to_show(url: &reqwest::Url) -> String {
    let mut shown = url.clone();
    shown.set_query(None);
    shown.set_fragment(None);
    // Only URLs that cannot have credentials refuse these, and have none.
    let _ = shown.set_password(None);
    let _ = shown.set_username("");
    shown.to_string()
}

/// True for addresses a webhook must not reach unless allowed: loopback,
/// private, link-local, unspecified, multicast, shared, documentation and
/// other reserved ranges, and IPv6 addresses that carry an IPv4 address
/// (mapped, NAT64 `64:ff9b::/96`, 6to4 `2002::/16`) when that one is
/// internal. The deprecated IPv4-compatible (`::/96`) and site-local
/// (`fec0::/10`) ranges are internal outright, and so are the translation
/// prefixes whose gateways may sit inside the network: SIIT's IPv4-translated
/// addresses (`::ffff:0:0:0/96`), local-use NAT64 (`64:ff9b:1::/48`, RFC
/// 8215) and Teredo (`2001::/32`).
pub fn is_internal(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_multicast()
                || v4.is_documentation()
                || a == 0
                || (a == 100 && (64..128).contains(&b))
                || (a == 192 && b == 0)
                || (a == 198 && (b == 18 || b == 19))
                || a >= 240
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_internal(IpAddr::V4(v4));
            }
            let segments = v6.segments();
            let first = segments[0];
            let embedded = |high: u16, low: u16| {
                let [a, b] = high.to_be_bytes();
                let [c, d] = low.to_be_bytes();
                is_internal(IpAddr::V4(std::net::Ipv4Addr::new(a, b, c, d)))
            };
            let nat64 = segments[..6] == [0x64, 0xff9b, 0, 0, 0, 0];
            let ipv4_compatible = segments[..6] == [0; 6];
            let ipv4_translated = segments[..6] == [0, 0, 0, 0, 0xffff, 0];
            let local_nat64 = segments[..3] == [0x64, 0xff9b, 1];
            let teredo = segments[..2] == [0x2001, 0];
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || ipv4_compatible
                || ipv4_translated
                || local_nat64
                || teredo
                || (nat64 && embedded(segments[6], segments[7]))
                || (first == 0x2002 && embedded(segments[1], segments[2]))
                || (first & 0xfe00) == 0xfc00
                || (first & 0xffc0) == 0xfe80
                || (first & 0xffc0) == 0xfec0
                || first == 0x2001 && segments[1] == 0x0db8
        }
    }
}

/// Refuses a URL whose host is an internal IP literal (DNS names are checked
/// by the resolver, after resolution).
fn check_literal_address(url: &str, allow_private: bool) -> Result<(), String> {
    if allow_private {
        return Ok(());
    }
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("invalid URL: {e}"))?;
    let host = parsed.host_str().unwrap_or_default();
    let Ok(ip) = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<IpAddr>()
    else {
        return Ok(());
    };
    if is_internal(ip) {
        return Err(format!(
            "refused: {ip} is an internal address (set webhooks.allow_private_networks to allow it)"
        ));
    }
    Ok(())
}

/// Resolves names with the system resolver and keeps only public addresses,
/// so a name cannot point a webhook into the private network.
struct PublicOnlyResolver;

impl reqwest::dns::Resolve for PublicOnlyResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let addresses: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0))
                .await?
                .filter(|address| !is_internal(address.ip()))
                .collect();
            if addresses.is_empty() {
                let refusal = format!(
                    "refused: {host} resolves only to internal addresses (set webhooks.allow_private_networks to allow it)"
                );
                return Err(refusal.into());
            }
            Ok(Box::new(addresses.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_addresses_are_recognised() {
        for internal in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "::1",
            "fe80::1",
            "fd00::1",
            "::ffff:127.0.0.1",
            "224.0.0.1",
            "64:ff9b::7f00:1",
            "64:ff9b::a9fe:a9fe",
            "2002:7f00:1::1",
            "2002:c0a8:101::",
            "::7f00:1",
            "::10.0.0.1",
            "fec0::1",
            "::ffff:0:5db8:d822",
            "::ffff:0:7f00:1",
            "64:ff9b:1::5db8:d822",
            "64:ff9b:1:ffff::1",
            "2001::1",
            "2001:0:4136:e378:8000:63bf:3fff:fdd2",
        ] {
            assert!(is_internal(internal.parse().unwrap()), "{internal}");
        }
        for public in [
            "93.184.216.34",
            "1.1.1.1",
            "2606:4700:4700::1111",
            "64:ff9b::5db8:d822",
            "2002:5db8:d822::1",
            "2001:4860:4860::8888",
            "2001:1::1",
        ] {
            assert!(!is_internal(public.parse().unwrap()), "{public}");
        }
    }

    #[test]
    fn a_url_is_shown_without_its_secrets() {
        let url = reqwest::Url::parse(
            "https://user:pw@hooks.example.com:8443/in?password=hunter2&x=1#frag",
        )
        .unwrap();
        assert_eq!(url_fit_to_show(&url), "https://hooks.example.com:8443/in");
    }

    #[test]
    fn literal_internal_urls_are_refused_unless_allowed() {
        assert!(check_literal_address("http://127.0.0.1:9/hook", false).is_err());
        assert!(check_literal_address("http://[::1]/hook", false).is_err());
        assert!(check_literal_address("http://[2001::5db8:d822]/hook", false).is_err());
        assert!(check_literal_address("http://[64:ff9b:1::a00:1]/hook", false).is_err());
        assert!(check_literal_address("http://[::ffff:0:a00:1]/hook", false).is_err());
        assert!(check_literal_address("http://127.0.0.1:9/hook", true).is_ok());
        assert!(check_literal_address("https://hooks.example.com/x", false).is_ok());
    }

    #[test]
    fn retry_after_is_read_in_seconds() {
        let mut headers = HeaderMap::new();
        headers.insert(RETRY_AFTER, "7".parse().unwrap());
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(7)));
        headers.insert(
            RETRY_AFTER,
            "Wed, 21 Oct 2015 07:28:00 GMT".parse().unwrap(),
        );
        assert_eq!(retry_after(&headers), None);
    }
}
