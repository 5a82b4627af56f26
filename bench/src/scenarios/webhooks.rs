//! Webhook delivery (`--only webhooks`) to a local receiver answering 200
//! after 5 ms. Order: a backlog over 100 scopes, committed at once, to a
//! subscription ordered by scope and to an unordered one in alternating
//! rounds: deliveries per second, and receipts before a lower number of
//! their scope. Rate: a `max_per_second` subscription served by two relays.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use eventrelay_publisher::{NewEvent, Publisher};
use tokio::net::TcpListener;

use crate::BenchResult;
use crate::context::Context;
use crate::publish::event_data;
use crate::relay_process::{RelayProcess, RelaySettings, WEBHOOK_TYPE};
use crate::report::{Table, alternating, joined, median, verdict};
use crate::scenarios::publish_throughput::serve_ok;
use crate::sse_load::event_number;

const SCOPES: usize = 100;
const ANSWER_AFTER: Duration = Duration::from_millis(5);
const RATE: usize = 50;
const PATIENCE: Duration = Duration::from_secs(120);

/// When each request came, in order, and the bench event number it carried.
#[derive(Clone, Default)]
struct Receipts(Arc<Mutex<Vec<(Instant, u32)>>>);

impl Receipts {
    fn lock(&self) -> MutexGuard<'_, Vec<(Instant, u32)>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    async fn wait_for(&self, count: usize) -> BenchResult<()> {
        let deadline = Instant::now() + PATIENCE;
        while self.lock().len() < count {
            if Instant::now() > deadline {
                let got = self.lock().len();
                return Err(format!("{got} of {count} webhooks received in {PATIENCE:?}").into());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(())
    }
}

/// Commits `events` webhook events, round robin over [`SCOPES`] scopes, in
/// one transaction; answers when it committed.
async fn backlog(cx: &Context, events: usize) -> BenchResult<Instant> {
    let mut client = eventrelay::connect(cx.db()).await?;
    let publisher = Publisher::new(&cx.schema)?;
    let event = |n| NewEvent::durable(WEBHOOK_TYPE, format!("hook-{}", n % SCOPES), event_data(n));
    let transaction = client.transaction().await?;
    let batch = (0..events).map(event).collect();
    publisher.emit_batch(&transaction, batch).await?;
    transaction.commit().await?;
    Ok(Instant::now())
}

/// Stops `relays`, then removes the bench subscription and its deliveries,
/// so that what one run left pending goes to no later one.
async fn stop(cx: &Context, relays: Vec<RelayProcess>) -> BenchResult<()> {
    for mut relay in relays {
        relay.terminate(Duration::from_secs(30)).await?;
    }
    let schema = &cx.schema;
    let client = eventrelay::connect(cx.db()).await?;
    let delete = format!(
        "DELETE FROM {schema}.webhook_deliveries WHERE subscription_id = 'bench';
         DELETE FROM {schema}.webhook_subscriptions WHERE id = 'bench'"
    );
    Ok(client.batch_execute(&delete).await?)
}

/// A receiver on a port of its own, until dropped.
struct Receiver {
    url: String,
    /// What it received.
    seen: Receipts,
    accept: tokio::task::JoinHandle<()>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

impl Receiver {
    async fn start() -> BenchResult<Receiver> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}/hook", listener.local_addr()?);
        let seen = Receipts::default();
        let noted = seen.clone();
        let note = move |request: &[u8]| {
            let number = event_number(request).unwrap_or(u32::MAX);
            noted.lock().push((Instant::now(), number));
        };
        let accept = serve_ok(listener, ANSWER_AFTER, note);
        Ok(Receiver { url, seen, accept })
    }

    /// A relay's settings subscribing this receiver, with `options` (TOML).
    fn settings(&self, cx: &Context, options: String) -> RelaySettings {
        let mut settings = cx.settings();
        settings.webhook_url = Some(self.url.clone());
        settings.extra_toml = format!("{options}\n");
        settings
    }

    /// `events` delivered by one relay with `ordering`: deliveries per second
    /// to the last receipt, and receipts before a lower number of their scope.
    async fn drain(
        &self,
        cx: &Context,
        ordering: &str,
        events: usize,
    ) -> BenchResult<(f64, usize)> {
        let options = format!("ordering = \"{ordering}\"");
        let relay = cx.start_relay(self.settings(cx, options)).await?;
        let committed = backlog(cx, events).await?;
        self.seen.wait_for(events).await?;
        stop(cx, vec![relay]).await?;
        let receipts = std::mem::take(&mut *self.seen.lock());
        let last = receipts.last().map_or(committed, |(at, _)| *at);
        let (mut highest, mut early) = ([None; SCOPES], 0);
        for (_, number) in receipts {
            let seen = &mut highest[number as usize % SCOPES];
            early += usize::from(seen.is_some_and(|seen| seen > number));
            *seen = (*seen).max(Some(number));
        }
        Ok((events as f64 / (last - committed).as_secs_f64(), early))
    }

    async fn order_row(&self, cx: &Context, table: &mut Table) -> BenchResult<()> {
        let (events, rounds) = if cx.args.quick { (500, 1) } else { (2_000, 5) };
        let orderings = ["scope", "none"];
        let figures = alternating(rounds, 2, async |round, case| {
            let (ordering, round) = (orderings[case], round + 1);
            eprintln!("webhooks: {events} events, ordering {ordering}, round {round}");
            self.drain(cx, ordering, events).await
        })
        .await?;
        let rates = |case: usize| -> Vec<f64> { figures[case].iter().map(|f| f.0).collect() };
        let early = |case: usize| -> usize { figures[case].iter().map(|f| f.1).sum() };
        let (ordered, unordered) = (median(&rates(0)), median(&rates(1)));
        let ratio = ordered / unordered;
        let [rounds_ordered, rounds_unordered] = [0, 1].map(|case| joined(&rates(case), 0, " / "));
        let [early_ordered, early_unordered] = [0, 1].map(early);
        let met = verdict(ratio >= 0.8 && early_ordered == 0);
        table.add(
            format!(
                "webhooks: {events} events over {SCOPES} scopes committed at once, 1 relay × 4 workers, receiver answering after 5 ms, ordered by scope vs unordered, {rounds} alternating rounds"
            ),
            format!(
                "ordered {ordered:.0} deliveries/s · unordered {unordered:.0} ({ratio:.2}×) · rounds ordered {rounds_ordered} · unordered {rounds_unordered} · received before a lower number of their scope: ordered {early_ordered}, unordered {early_unordered}"
            ),
            format!("ordered ≥ 0.8× unordered, in order: {met}"),
        );
        Ok(())
    }

    /// A backlog to a subscription of [`RATE`] a second, sent by two
    /// relays: receipts in each second from the first.
    async fn rate_row(&self, cx: &Context, table: &mut Table) -> BenchResult<()> {
        let (events, window) = if cx.args.quick { (500, 5) } else { (3_000, 30) };
        eprintln!("webhooks: {events} events at most {RATE}/s, 2 relays, {window} s");
        let settings = self.settings(cx, format!("max_per_second = {RATE}"));
        let relays = vec![
            cx.start_relay(settings.clone()).await?,
            cx.start_relay(settings).await?,
        ];
        backlog(cx, events).await?;
        self.seen.wait_for(1).await?;
        let start = self.seen.lock()[0].0;
        tokio::time::sleep_until((start + Duration::from_secs(window as u64)).into()).await;
        let (delivered, mut shares) = ("webhook_deliveries_total{outcome=\"delivered\"}", vec![]);
        for relay in &relays {
            shares.push(relay.metric(delivered).await);
        }
        stop(cx, relays).await?;
        let mut seconds = vec![0; window];
        for (at, _) in std::mem::take(&mut *self.seen.lock()) {
            if let Some(second) = seconds.get_mut(at.duration_since(start).as_secs() as usize) {
                *second += 1;
            }
        }
        let mean = seconds.iter().sum::<usize>() as f64 / window as f64;
        let min = seconds.iter().min().unwrap_or(&0);
        let max = seconds.iter().max().unwrap_or(&0);
        let counts: Vec<f64> = seconds.iter().map(|&n| n as f64).collect();
        let (each, shares) = (joined(&counts, 0, ", "), joined(&shares, 0, " / "));
        let within = RATE as f64 * 0.9..=RATE as f64 * 1.1;
        let outside = counts.iter().filter(|n| !within.contains(*n)).count();
        let met = verdict(within.contains(&mean));
        table.add(
            format!(
                "webhooks: max_per_second {RATE}, 2 relays × 4 workers, backlog of {events} events, receipts per second over {window} s"
            ),
            format!(
                "mean {mean:.1}/s · min {min} · max {max} · each second {each} · delivered by each relay {shares}"
            ),
            format!("{RATE}/s ± 10%: {met} (mean), {outside} of {window} seconds outside"),
        );
        Ok(())
    }
}

pub async fn rows(cx: &Context, table: &mut Table) -> BenchResult<()> {
    let receiver = Receiver::start().await?;
    receiver.order_row(cx, table).await?;
    receiver.rate_row(cx, table).await
}
