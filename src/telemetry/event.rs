//! One traced event's way through this relay, recorded as it happens and
//! exported as spans once its streams have all been written to:
//!
//! - `eventrelay.deliver`, the parent, from when the listener (or the
//!   replication stream) heard the event to its last socket write;
//! - `eventrelay.read`, from heard to the hub's fan-out: the decoding, or
//!   the read of the outbox when the notification did not carry the row,
//!   and the wait in the hub's mailbox;
//! - `eventrelay.fan_out`, the hub queueing it to each stream;
//! - `eventrelay.write`, from the first stream's write to the last.
//!
//! A stream counts as written when it hands the event's frame to the HTTP
//! layer. A stream that ends before it writes (its client left, or it was
//! dropped as too slow) never does: the spans are then sent after
//! [`WRITES_WAIT`] with what was written, and the count that was not.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry::trace::{Span as _, SpanKind, TraceContextExt as _, Tracer as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::SdkTracer;

/// How long after its fan-out an event's spans wait for streams that have
/// not written it yet.
pub const WRITES_WAIT: Duration = Duration::from_secs(5);

/// A traced event's stamps, shared by the hub that fans it out and every
/// stream it is queued to.
pub struct EventTrace {
    tracer: SdkTracer,
    /// Holds the `eventrelay.deliver` span.
    cx: Context,
    heard: Option<SystemTime>,
    fan_out: Mutex<Option<(SystemTime, SystemTime)>>,
    /// Streams it was queued to; `usize::MAX` until the fan-out ends.
    queued: AtomicUsize,
    written: AtomicUsize,
    /// Nanoseconds since the Unix epoch; 0 before the first write.
    first_write: AtomicU64,
    last_write: AtomicU64,
    finished: AtomicBool,
}

impl std::fmt::Debug for EventTrace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventTrace")
            .field("written", &self.written.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl EventTrace {
    /// Starts the `eventrelay.deliver` span under `parent`, from when the
    /// event was heard or, for rows read back from the outbox, from when
    /// its fan-out `began`; `None` when the sampler leaves the trace
    /// unrecorded. The attributes are built only for a recorded span: an
    /// unsampled event costs the fan-out no allocation for them.
    pub(super) fn start(
        tracer: &SdkTracer,
        parent: Context,
        heard: Option<SystemTime>,
        began: SystemTime,
        attributes: impl FnOnce() -> Vec<KeyValue>,
    ) -> Option<Arc<EventTrace>> {
        let builder = tracer
            .span_builder("eventrelay.deliver")
            .with_kind(SpanKind::Consumer)
            .with_start_time(heard.unwrap_or(began));
        let mut span = tracer.build_with_context(builder, &parent);
        if !span.span_context().is_sampled() {
            return None;
        }
        span.set_attributes(attributes());
        Some(Arc::new(EventTrace {
            tracer: tracer.clone(),
            cx: Context::new().with_span(span),
            heard,
            fan_out: Mutex::new(None),
            queued: AtomicUsize::new(usize::MAX),
            written: AtomicUsize::new(0),
            first_write: AtomicU64::new(0),
            last_write: AtomicU64::new(0),
            finished: AtomicBool::new(false),
        }))
    }

    /// The hub has queued the event to `queued` streams, between `started`
    /// and now. With none, or all of them written already, the spans go
    /// out now; otherwise once the last stream writes, or after
    /// [`WRITES_WAIT`].
    pub fn fanned_out(self: &Arc<Self>, started: SystemTime, queued: usize) {
        *self.fan_out.lock().unwrap_or_else(PoisonError::into_inner) =
            Some((started, SystemTime::now()));
        self.queued.store(queued, Ordering::Release);
        if self.written.load(Ordering::Acquire) >= queued {
            self.finish();
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let trace = Arc::clone(self);
            runtime.spawn(async move {
                tokio::time::sleep(WRITES_WAIT).await;
                trace.finish();
            });
        }
    }

    /// A stream handed the event's frame to the HTTP layer.
    pub fn written(&self) {
        let now = nanos(SystemTime::now());
        let _ = self
            .first_write
            .compare_exchange(0, now, Ordering::AcqRel, Ordering::Acquire);
        self.last_write.fetch_max(now, Ordering::AcqRel);
        let written = self.written.fetch_add(1, Ordering::AcqRel) + 1;
        if written >= self.queued.load(Ordering::Acquire) {
            self.finish();
        }
    }

    /// Exports the spans, once.
    fn finish(&self) {
        if self.finished.swap(true, Ordering::AcqRel) {
            return;
        }
        let fan_out = *self.fan_out.lock().unwrap_or_else(PoisonError::into_inner);
        let queued = self.queued.load(Ordering::Acquire);
        let written = self.written.load(Ordering::Acquire);
        let child = |name: &'static str, start: SystemTime, end: SystemTime, attrs| {
            let mut span = self
                .tracer
                .span_builder(name)
                .with_start_time(start)
                .with_attributes(attrs)
                .start_with_context(&self.tracer, &self.cx);
            span.end_with_timestamp(end);
        };
        let mut end = SystemTime::now();
        if let Some((started, ended)) = fan_out {
            if let Some(heard) = self.heard {
                child("eventrelay.read", heard, started, vec![]);
            }
            child(
                "eventrelay.fan_out",
                started,
                ended,
                vec![KeyValue::new("eventrelay.streams", queued as i64)],
            );
            end = ended;
        }
        let (first, last) = (
            self.first_write.load(Ordering::Acquire),
            self.last_write.load(Ordering::Acquire),
        );
        if first != 0 {
            child(
                "eventrelay.write",
                from_nanos(first),
                from_nanos(last),
                vec![KeyValue::new("eventrelay.streams", written as i64)],
            );
            end = end.max(from_nanos(last));
        }
        let span = self.cx.span();
        span.set_attribute(KeyValue::new("eventrelay.streams_written", written as i64));
        if queued != usize::MAX && written < queued {
            span.set_attribute(KeyValue::new(
                "eventrelay.streams_not_written",
                (queued - written) as i64,
            ));
        }
        span.end_with_timestamp(end);
    }
}

fn nanos(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos().max(1) as u64)
}

fn from_nanos(nanos: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(nanos)
}
