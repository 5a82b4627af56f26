//! The hub: one actor per active scope, on one of the hub threads, owning
//! the scope's [`HubCore`] (its subscribers and bounded tail) behind a
//! lock. Each event arrives encoded once; the core filters it per
//! subscriber with the audience predicate and queues the shared frame.
//!
//! Durable events, events from other relays, joins and leaves reach the
//! core through the actor's mailbox. A small scope's ephemeral events
//! published through this relay's own API skip it: the publish handler
//! runs the fan-out on the thread that read the request
//! ([`HubHandle::publish_here`]), so a stream on that thread is woken with
//! no other thread in between, and the rest with one wake each.

use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use actix::{Actor, Addr, AsyncContext, Context, Handler, Message, MessageResult, WeakAddr};

use prometheus_client::metrics::counter::Counter;
use std::sync::atomic::AtomicU64;

use super::encoded::EncodedEvent;
pub use super::hub_core::FrameSender;
pub use super::hub_core::Joining;
use super::hub_core::{HubCore, Runner, lock};
use super::mailbox::Counted;
use super::tail::Bound;
use super::tail_budget::{ShrinkTail, TailBudget};
use crate::latency::Stage;
use crate::metrics::{ActorKind, ActorLoad, Handling, Metrics};

/// The most subscribers a scope may have for a publish handler to fan its
/// ephemeral events out itself. The loop takes about 0.3 ms per 1,000
/// subscribers, and every stream on the publishing thread waits for it:
/// a larger scope's loop goes to its hub's thread, which keeps the HTTP
/// workers free to write.
pub const PUBLISHER_FAN_OUT_MAX: usize = 2_000;

pub struct Hub {
    core: Arc<Mutex<HubCore>>,
    budget: Arc<TailBudget>,
    metrics: Arc<Metrics>,
    /// The arbiter this hub runs on, for its load metrics.
    arbiter: usize,
    /// That arbiter's busy time, taken once rather than per message.
    busy: Counter<f64, AtomicU64>,
}

impl Hub {
    pub fn new(
        scope_key: String,
        max_events: Bound,
        max_bytes: Bound,
        budget: Arc<TailBudget>,
        metrics: Arc<Metrics>,
    ) -> Self {
        let core = HubCore::new(scope_key, max_events, max_bytes, Arc::clone(&metrics));
        Hub {
            core: Arc::new(Mutex::new(core)),
            budget,
            busy: metrics.arbiter_busy(0),
            metrics,
            arbiter: 0,
        }
    }

    /// Runs on hub arbiter `arbiter` (for the per-arbiter load metrics).
    pub fn on_arbiter(mut self, arbiter: usize) -> Self {
        self.arbiter = arbiter;
        self.busy = self.metrics.arbiter_busy(arbiter);
        self
    }

    /// Starts the hub on `arbiter_handle` and answers the handle the relay
    /// and the publish handlers reach it by.
    pub fn start_on(self, arbiter_handle: &actix::ArbiterHandle) -> HubHandle {
        let core = Arc::clone(&self.core);
        let load = self.metrics.actor(ActorKind::Hub).clone();
        let addr = Hub::start_in_arbiter(arbiter_handle, |_| self);
        HubHandle {
            addr: Counted::new(addr, load),
            core,
        }
    }

    /// Times one message's handling, as this kind's and this arbiter's load.
    fn handling(&self) -> Handling {
        self.metrics
            .actor(ActorKind::Hub)
            .handling()
            .on_arbiter(&self.busy)
    }
}

impl Actor for Hub {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let lease = self.budget.join(ctx.address().downgrade().recipient());
        lock(&self.core).tail.join_budget(lease);
        self.metrics.arbiter_hubs(self.arbiter).inc();
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        self.metrics.arbiter_hubs(self.arbiter).dec();
    }
}

/// A running hub, as the relay and the publish handlers hold it: its
/// mailbox and its core. Every message that carries events is counted on
/// the core as it is sent (see [`HubCore`]'s `in_mailbox`), so a publish
/// handler never overtakes events already on their way to the hub.
#[derive(Clone)]
pub struct HubHandle {
    addr: Counted<Addr<Hub>>,
    core: Arc<Mutex<HubCore>>,
}

/// Where [`HubHandle::publish_here`] fanned an event out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FannedOut {
    /// On the calling thread, before it returned.
    Here,
    /// By the hub's thread: the scope is large, or events were already on
    /// their way to the hub.
    ByTheHub,
}

impl HubHandle {
    pub fn publish_durable(&self, msg: PublishDurable) {
        self.send_events(&mut lock(&self.core), msg);
    }

    pub fn publish_ephemeral(&self, msg: PublishEphemeral) {
        self.send_events(&mut lock(&self.core), msg);
    }

    /// Sends a message that carries events to the hub, counted on its
    /// core (which the caller holds locked) until the hub takes it.
    fn send_events<M>(&self, core: &mut HubCore, msg: M)
    where
        M: Message<Result = ()> + Send + 'static,
        Hub: Handler<M>,
    {
        core.in_mailbox += 1;
        self.addr.do_send(msg);
    }

    /// Fans an ephemeral event out on the calling thread when the scope is
    /// small and nothing is waiting in the hub's mailbox; otherwise sends
    /// it there, behind what is waiting.
    pub fn publish_here(&self, event: Arc<EncodedEvent>, heard_at: Instant) -> FannedOut {
        let mut core = lock(&self.core);
        if core.in_mailbox == 0 && core.subscribers() <= PUBLISHER_FAN_OUT_MAX {
            core.stages().since(Stage::Relay, heard_at);
            core.supervised(|core| core.fan_out(&event, Runner::Publisher, Some(heard_at)));
            FannedOut::Here
        } else {
            let msg = PublishEphemeral {
                event,
                heard_at: Some(heard_at),
            };
            self.send_events(&mut core, msg);
            FannedOut::ByTheHub
        }
    }

    pub fn attach(&self, msg: Attach) -> actix::dev::Request<Hub, Attach> {
        self.addr.send(msg)
    }

    pub fn detach(&self, session: u64) {
        self.addr.do_send(Detach { session });
    }

    #[cfg(feature = "fault-injection")]
    pub fn inject_fault(&self) {
        self.addr.do_send(InjectFault);
    }

    /// Whether the hub is still running.
    pub fn connected(&self) -> bool {
        self.addr.addr().connected()
    }

    pub fn downgrade(&self) -> WeakHub {
        WeakHub {
            addr: self.addr.addr().downgrade(),
            load: self.addr.load().clone(),
            core: Arc::downgrade(&self.core),
        }
    }
}

/// A [`HubHandle`] that does not keep its hub running.
#[derive(Clone)]
pub struct WeakHub {
    addr: WeakAddr<Hub>,
    load: ActorLoad,
    core: Weak<Mutex<HubCore>>,
}

impl WeakHub {
    pub fn upgrade(&self) -> Option<HubHandle> {
        Some(HubHandle {
            addr: Counted::new(self.addr.upgrade()?, self.load.clone()),
            core: self.core.upgrade()?,
        })
    }
}

impl Handler<ShrinkTail> for Hub {
    type Result = ();

    fn handle(&mut self, _: ShrinkTail, _: &mut Context<Self>) {
        lock(&self.core).tail.empty();
        self.metrics.tails_shrunk.inc();
    }
}

/// Durable events read from the outbox after `read_after`, new to this hub,
/// in seq order. Sent through [`HubHandle::publish_durable`].
#[derive(Message)]
#[rtype(result = "()")]
pub struct PublishDurable {
    pub read_after: i64,
    pub events: Vec<Arc<EncodedEvent>>,
    /// When the listener heard them; `None` for rows read back from the
    /// outbox.
    pub heard_at: Option<Instant>,
}

impl Handler<PublishDurable> for Hub {
    type Result = ();

    fn handle(&mut self, msg: PublishDurable, _: &mut Context<Self>) {
        let _handling = self.handling();
        if let Some(heard_at) = msg.heard_at {
            self.metrics.stages.since(Stage::Relay, heard_at);
        }
        let mut core = lock(&self.core);
        core.taken_from_mailbox();
        core.supervised(|core| core.publish_durable(msg.read_after, &msg.events, msg.heard_at));
    }
}

/// An ephemeral event: fanned out, never kept. Sent through
/// [`HubHandle::publish_ephemeral`] or [`HubHandle::publish_here`].
#[derive(Message)]
#[rtype(result = "()")]
pub struct PublishEphemeral {
    pub event: Arc<EncodedEvent>,
    /// When the listener heard it, or when this relay's publish API
    /// parsed it (see `DeliveredHere`), for the `relay` stage.
    pub heard_at: Option<Instant>,
}

impl Handler<PublishEphemeral> for Hub {
    type Result = ();

    fn handle(&mut self, msg: PublishEphemeral, _: &mut Context<Self>) {
        let _handling = self.handling();
        if let Some(heard_at) = msg.heard_at {
            self.metrics.stages.since(Stage::Relay, heard_at);
        }
        let mut core = lock(&self.core);
        core.taken_from_mailbox();
        core.supervised(|core| core.fan_out(&msg.event, Runner::Hub, msg.heard_at));
    }
}

/// Adds a subscriber; answers its replay from the tail (see
/// [`HubCore::attach`]).
#[derive(Message)]
#[rtype(result = "Option<Vec<Arc<EncodedEvent>>>")]
pub struct Attach(pub Joining);

impl Handler<Attach> for Hub {
    type Result = MessageResult<Attach>;

    fn handle(&mut self, Attach(joining): Attach, _: &mut Context<Self>) -> Self::Result {
        let _handling = self.handling();
        MessageResult(lock(&self.core).attach(joining))
    }
}

#[derive(Message)]
#[rtype(result = "()")]
pub struct Detach {
    pub session: u64,
}

impl Handler<Detach> for Hub {
    type Result = ();

    fn handle(&mut self, msg: Detach, _: &mut Context<Self>) {
        let _handling = self.handling();
        lock(&self.core).detach(msg.session);
    }
}

/// Makes the hub fail, to test its supervision.
#[cfg(feature = "fault-injection")]
#[derive(Message)]
#[rtype(result = "()")]
pub struct InjectFault;

#[cfg(feature = "fault-injection")]
impl Handler<InjectFault> for Hub {
    type Result = ();

    fn handle(&mut self, _: InjectFault, _: &mut Context<Self>) {
        let _handling = self.handling();
        lock(&self.core).supervised(|_| panic!("fault injected into a hub"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actors::tail_budget::TailBudget;
    use chrono::Utc;
    use eventrelay_wire::NewEvent;
    use eventrelay_wire::Subscriber;
    use serde_json::json;
    use std::time::Duration;
    use tokio::sync::mpsc;

    fn hub() -> HubHandle {
        let metrics = Arc::new(Metrics::default());
        let budget = TailBudget::new(1 << 20, Default::default());
        Hub::new(
            "s".into(),
            Arc::new(|| 16),
            Arc::new(|| 1 << 20),
            budget,
            metrics,
        )
        .start_on(&actix::Arbiter::current())
    }

    fn durable(seq: i64) -> Arc<EncodedEvent> {
        let mut envelope = NewEvent::durable("t", "s", json!({})).into_envelope(Utc::now());
        envelope.seq = Some(seq);
        Arc::new(EncodedEvent::new(envelope))
    }

    fn ephemeral() -> Arc<EncodedEvent> {
        let envelope = NewEvent::ephemeral("t", "s", json!({})).into_envelope(Utc::now());
        Arc::new(EncodedEvent::new(envelope))
    }

    async fn join(hub: &HubHandle, session: u64) -> mpsc::Receiver<Arc<EncodedEvent>> {
        let (queue, frames) = mpsc::channel(8);
        hub.attach(Attach(Joining {
            session,
            subscriber: Subscriber::new("s", format!("u{session}")),
            queue,
            replay_after: None,
            hide_committed_before: None,
            presence: None,
        }))
        .await
        .expect("the hub is running");
        frames
    }

    async fn next(frames: &mut mpsc::Receiver<Arc<EncodedEvent>>) -> Arc<EncodedEvent> {
        tokio::time::timeout(Duration::from_secs(5), frames.recv())
            .await
            .expect("an event within 5 s")
            .expect("the queue is open")
    }

    #[actix::test]
    async fn a_small_scopes_ephemeral_event_is_queued_before_the_publish_returns() {
        let hub = hub();
        let mut frames = join(&hub, 1).await;
        let event = ephemeral();
        assert_eq!(
            hub.publish_here(Arc::clone(&event), Instant::now()),
            FannedOut::Here
        );
        // No await in between: nothing but this thread can have queued it.
        let queued = frames.try_recv().expect("queued on this thread");
        assert!(Arc::ptr_eq(&queued, &event));
    }

    #[actix::test]
    async fn a_publish_never_overtakes_events_on_their_way_to_the_hub() {
        let hub = hub();
        let mut frames = join(&hub, 1).await;
        hub.publish_durable(PublishDurable {
            read_after: 0,
            events: vec![durable(1)],
            heard_at: None,
        });
        let event = ephemeral();
        assert_eq!(
            hub.publish_here(Arc::clone(&event), Instant::now()),
            FannedOut::ByTheHub
        );
        assert_eq!(next(&mut frames).await.seq(), Some(1));
        assert!(Arc::ptr_eq(&next(&mut frames).await, &event));
        // The hub has caught up: the next one goes out here again.
        assert_eq!(
            hub.publish_here(ephemeral(), Instant::now()),
            FannedOut::Here
        );
        assert!(frames.try_recv().is_ok());
    }

    #[actix::test]
    async fn a_publishers_events_arrive_in_its_order_while_the_hub_runs_on_another_thread() {
        // The hub on a thread of its own, handling the durable events
        // while this thread keeps publishing: each ephemeral event goes
        // out here or behind them, never ahead.
        let arbiter = actix::Arbiter::new();
        let metrics = Arc::new(Metrics::default());
        let budget = TailBudget::new(1 << 20, Default::default());
        let hub = Hub::new(
            "s".into(),
            Arc::new(|| 16),
            Arc::new(|| 1 << 20),
            budget,
            metrics,
        )
        .start_on(&arbiter.handle());
        let (queue, mut frames) = mpsc::channel(4096);
        hub.attach(Attach(Joining {
            session: 1,
            subscriber: Subscriber::new("s", "u1"),
            queue,
            replay_after: None,
            hide_committed_before: None,
            presence: None,
        }))
        .await
        .expect("the hub is running");
        let mut sent = Vec::new();
        for seq in 1..=1_000 {
            let event = durable(seq);
            sent.push(Arc::clone(&event));
            hub.publish_durable(PublishDurable {
                read_after: seq - 1,
                events: vec![event],
                heard_at: None,
            });
            for _ in 0..2 {
                let event = ephemeral();
                sent.push(Arc::clone(&event));
                hub.publish_here(event, Instant::now());
            }
        }
        for (index, expected) in sent.iter().enumerate() {
            let got = next(&mut frames).await;
            assert!(Arc::ptr_eq(&got, expected), "event {index} out of order");
        }
        assert!(frames.try_recv().is_err(), "nothing more");
        arbiter.stop();
    }

    #[actix::test]
    async fn a_large_scopes_loop_runs_on_its_hubs_thread() {
        let hub = hub();
        let mut all = Vec::new();
        for session in 0..=PUBLISHER_FAN_OUT_MAX as u64 {
            all.push(join(&hub, session).await);
        }
        let event = ephemeral();
        assert_eq!(
            hub.publish_here(Arc::clone(&event), Instant::now()),
            FannedOut::ByTheHub
        );
        for frames in &mut all {
            assert!(Arc::ptr_eq(&next(frames).await, &event));
        }
    }
}
