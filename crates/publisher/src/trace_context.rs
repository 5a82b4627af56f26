//! The current `tracing` span as an event's trace context (feature
//! `tracing-opentelemetry`): an application that traces with
//! `tracing-opentelemetry` has each event it emits continue the span it is
//! emitted in, so the relay's spans and the webhook request join the
//! application's trace without passing a `traceparent` by hand.

use eventrelay_wire::NewEvent;
use opentelemetry::trace::TraceContextExt as _;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// `event`, continuing the current span's trace unless it names a
/// `traceparent` of its own or no span with a valid context is current.
pub(crate) fn from_current_span(event: NewEvent) -> NewEvent {
    if event.traceparent.is_some() {
        return event;
    }
    let context = tracing::Span::current().context();
    let span = context.span();
    let span_context = span.span_context();
    if !span_context.is_valid() {
        return event;
    }
    let traceparent = format!(
        "00-{}-{}-{:02x}",
        span_context.trace_id(),
        span_context.span_id(),
        span_context.trace_flags().to_u8()
    );
    event.with_traceparent(&traceparent)
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::TracerProvider as _;
    use serde_json::json;
    use tracing_subscriber::layer::SubscriberExt as _;

    fn event() -> NewEvent {
        NewEvent::durable("order.paid", "org-1", json!({}))
    }

    #[test]
    fn an_event_continues_the_span_it_is_emitted_in() {
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!("checkout");
            let _entered = span.enter();
            let expected = span.context().span().span_context().clone();
            let traced = from_current_span(event());
            let parent =
                eventrelay_wire::TraceParent::parse(traced.traceparent.as_deref().unwrap())
                    .expect("a valid traceparent");
            assert_eq!(
                parent.trace_id.to_be_bytes(),
                expected.trace_id().to_bytes()
            );
            assert_eq!(
                parent.parent_id.to_be_bytes(),
                expected.span_id().to_bytes()
            );
            assert!(parent.sampled());

            let own = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
            let kept = from_current_span(event().with_traceparent(own));
            assert_eq!(kept.traceparent.as_deref(), Some(own), "its own wins");
        });
        let outside = from_current_span(event());
        assert_eq!(outside.traceparent, None, "no span, no trace");
    }
}
