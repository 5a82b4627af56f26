//! Addresses that count what they send: the mailbox-depth gauge of an actor
//! kind goes up here, where a message is sent, and down in the handler
//! (`ActorLoad::handling`), so no call site counts by hand.

use actix::dev::Request;
use actix::dev::ToEnvelope;
use actix::{Actor, Addr, Handler, Message, Recipient};

use crate::metrics::ActorLoad;

/// An actor's address (or a recipient of one message type) whose sends are
/// counted in `load`'s mailbox depth.
#[derive(Clone)]
pub struct Counted<T> {
    to: T,
    load: ActorLoad,
}

impl<T> Counted<T> {
    pub fn new(to: T, load: ActorLoad) -> Self {
        Counted { to, load }
    }

    /// The load its sends are counted in.
    pub fn load(&self) -> &ActorLoad {
        &self.load
    }
}

impl<A: Actor> Counted<Addr<A>> {
    /// Sends without waiting for the answer.
    pub fn do_send<M>(&self, message: M)
    where
        M: Message + Send + 'static,
        M::Result: Send,
        A: Handler<M>,
        A::Context: ToEnvelope<A, M>,
    {
        self.load.queued();
        self.to.do_send(message);
    }

    /// Sends and answers the handler's result.
    pub fn send<M>(&self, message: M) -> Request<A, M>
    where
        M: Message + Send + 'static,
        M::Result: Send,
        A: Handler<M>,
        A::Context: ToEnvelope<A, M>,
    {
        self.load.queued();
        self.to.send(message)
    }

    /// The same actor, reached through a recipient of one message type.
    pub fn recipient<M>(&self) -> Counted<Recipient<M>>
    where
        M: Message + Send + 'static,
        M::Result: Send,
        A: Handler<M>,
        A::Context: ToEnvelope<A, M>,
    {
        Counted::new(self.to.clone().recipient(), self.load.clone())
    }

    /// The plain address, for what is not a message (stopping the actor).
    pub fn addr(&self) -> &Addr<A> {
        &self.to
    }
}

impl<M> Counted<Recipient<M>>
where
    M: Message + Send,
    M::Result: Send,
{
    /// Sends without waiting for the answer.
    pub fn do_send(&self, message: M) {
        self.load.queued();
        self.to.do_send(message);
    }
}
