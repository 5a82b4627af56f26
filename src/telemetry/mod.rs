//! Traces: the relay's OpenTelemetry spans, exported over OTLP/HTTP with
//! protobuf when `telemetry.otlp_endpoint` is set, and the W3C trace
//! context that travels with each event.
//!
//! An event's trace starts in the application (a `traceparent` given at
//! publish, stored with the outbox row), or at the relay's publish API, or,
//! for an event that arrives with none, at the relay that hears it
//! (sampled by `telemetry.sample_ratio`). The relay's spans continue it:
//! the publish request and its group commit, each relay's delivery of the
//! event to its streams ([`EventTrace`]), and each webhook attempt, whose
//! request carries the trace on as `traceparent`.
//!
//! The spans are made with the OpenTelemetry API directly rather than
//! through `tracing`: a delivery's stages happen in several actors and
//! threads and are known only afterwards (the first and last socket write
//! of thousands of streams), so their spans are built with the times the
//! stages were stamped at. The provider is this relay's own value, not a
//! process-wide global, like every other setting.

mod event;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use eventrelay_wire::TraceParent;
use opentelemetry::trace::{
    Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt as _, TraceFlags, TraceId,
    TraceState, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracer, SdkTracerProvider,
};
use serde::{Deserialize, Serialize};

pub use event::EventTrace;

/// The `[telemetry]` settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// An OTLP/HTTP receiver (a collector, Jaeger, Tempo), such as
    /// `http://127.0.0.1:4318`; `/v1/traces` is added unless the path names
    /// it already. Unset, nothing is exported and no span is made.
    pub otlp_endpoint: Option<String>,
    /// The `service.name` of the relay's spans.
    pub service_name: String,
    /// The share of traces that start at the relay which are recorded: a
    /// publish request without `traceparent`, an event emitted without one.
    /// A trace that arrives with a `traceparent` follows its sampled flag.
    pub sample_ratio: f64,
    /// How long finished spans wait to be sent together.
    pub export_delay_ms: u64,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        TelemetryConfig {
            otlp_endpoint: None,
            service_name: "eventrelay".to_owned(),
            sample_ratio: 0.01,
            export_delay_ms: 5000,
        }
    }
}

impl TelemetryConfig {
    /// Checks the settings; the error names the one at fault.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        if !(0.0..=1.0).contains(&self.sample_ratio) {
            return Err((
                "telemetry.sample_ratio",
                format!("is {}; it must be between 0 and 1", self.sample_ratio),
            ));
        }
        if self.service_name.trim().is_empty() {
            return Err(("telemetry.service_name", "must not be empty".to_owned()));
        }
        if self.export_delay_ms == 0 {
            return Err(("telemetry.export_delay_ms", "must be at least 1".to_owned()));
        }
        if let Some(endpoint) = &self.otlp_endpoint {
            let url = reqwest::Url::parse(endpoint).map_err(|error| {
                (
                    "telemetry.otlp_endpoint",
                    format!("{endpoint:?} is not a URL: {error}"),
                )
            })?;
            if !matches!(url.scheme(), "http" | "https") {
                return Err((
                    "telemetry.otlp_endpoint",
                    format!("{endpoint:?} must be an http:// or https:// URL"),
                ));
            }
        }
        Ok(())
    }

    /// The URL spans are posted to.
    fn traces_url(endpoint: &str) -> String {
        let endpoint = endpoint.trim_end_matches('/');
        if endpoint.ends_with("/v1/traces") {
            endpoint.to_owned()
        } else {
            format!("{endpoint}/v1/traces")
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("cannot build the OTLP exporter for telemetry.otlp_endpoint: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
}

/// This relay's tracing: off (the default, costing a branch per event), or
/// a tracer whose spans go to the OTLP endpoint. Cheap to clone.
#[derive(Clone, Default)]
pub struct Tracing {
    exporting: Option<Arc<Exporting>>,
}

struct Exporting {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
}

impl std::fmt::Debug for Tracing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracing")
            .field("exporting", &self.exporting.is_some())
            .finish()
    }
}

impl Tracing {
    /// Starts exporting when `config` names an endpoint; off otherwise.
    pub fn start(config: &TelemetryConfig) -> Result<Tracing, TelemetryError> {
        let Some(endpoint) = &config.otlp_endpoint else {
            return Ok(Tracing::default());
        };
        use opentelemetry_otlp::{Protocol, WithExportConfig as _};
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(TelemetryConfig::traces_url(endpoint))
            .with_timeout(Duration::from_secs(10))
            .build()?;
        let batch = BatchSpanProcessor::builder(exporter)
            .with_batch_config(
                BatchConfigBuilder::default()
                    .with_scheduled_delay(Duration::from_millis(config.export_delay_ms))
                    .build(),
            )
            .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(batch)
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                config.sample_ratio,
            ))))
            .with_resource(
                opentelemetry_sdk::Resource::builder()
                    .with_service_name(config.service_name.clone())
                    .build(),
            )
            .build();
        let tracer = provider.tracer("eventrelay");
        Ok(Tracing {
            exporting: Some(Arc::new(Exporting { provider, tracer })),
        })
    }

    pub fn is_on(&self) -> bool {
        self.exporting.is_some()
    }

    /// Sends the spans still waiting and stops the exporter; blocks until
    /// they are sent or the export times out, so call it off the runtime's
    /// threads (see `server::shutdown`).
    pub fn shutdown(&self) {
        if let Some(exporting) = &self.exporting
            && let Err(error) = exporting.provider.shutdown()
        {
            tracing::warn!(%error, "could not send the last spans");
        }
    }

    /// The span of a publish request, continuing the caller's
    /// `traceparent` or starting a trace (sampled by ratio).
    pub fn publish(
        &self,
        parent: Option<TraceParent>,
        events: usize,
        received: SystemTime,
    ) -> PublishTrace {
        let Some(exporting) = &self.exporting else {
            return PublishTrace {
                span: None,
                traceparent: passed_on(parent),
            };
        };
        let span = exporting.span(
            "eventrelay.publish",
            SpanKind::Server,
            parent,
            received,
            vec![KeyValue::new("eventrelay.events", events as i64)],
        );
        let cx = Context::new().with_span(span);
        let traceparent = traceparent_of(cx.span().span_context());
        PublishTrace {
            span: Some(PublishSpans {
                tracer: exporting.tracer.clone(),
                cx,
            }),
            traceparent,
        }
    }

    /// The delivery of one event by this relay, when it is traced: it
    /// continues the event's `traceparent` if sampled there, or starts a
    /// trace sampled by ratio when it has none. `heard` is when the
    /// listener heard it, when known; `fan_out` when its hub began fanning
    /// it out.
    pub fn event(
        &self,
        parent: Option<TraceParent>,
        heard: Option<SystemTime>,
        fan_out: SystemTime,
        attributes: impl FnOnce() -> Vec<KeyValue>,
    ) -> Option<Arc<EventTrace>> {
        let exporting = self.exporting.as_ref()?;
        if parent.is_some_and(|p| !p.sampled()) {
            return None;
        }
        EventTrace::start(
            &exporting.tracer,
            remote_parent(parent),
            heard,
            fan_out,
            attributes,
        )
    }

    /// The span of one webhook attempt, and the `traceparent` its request
    /// carries: the attempt's own context when tracing, else the event's
    /// as stored.
    pub fn webhook_attempt(&self, stored: Option<&str>, attributes: Vec<KeyValue>) -> AttemptTrace {
        let parent = TraceParent::parse_optional(stored);
        let Some(exporting) = &self.exporting else {
            return AttemptTrace {
                span: None,
                traceparent: passed_on(parent),
            };
        };
        let span = exporting.span(
            "eventrelay.webhook.attempt",
            SpanKind::Client,
            parent,
            SystemTime::now(),
            attributes,
        );
        let traceparent = traceparent_of(span.span_context());
        AttemptTrace {
            span: Some(span),
            traceparent,
        }
    }
}

impl Exporting {
    /// A span under the caller's `parent`, or the root of a new trace.
    fn span(
        &self,
        name: &'static str,
        kind: SpanKind,
        parent: Option<TraceParent>,
        start: SystemTime,
        attributes: Vec<KeyValue>,
    ) -> opentelemetry_sdk::trace::Span {
        let builder = self
            .tracer
            .span_builder(name)
            .with_kind(kind)
            .with_start_time(start)
            .with_attributes(attributes);
        self.tracer
            .build_with_context(builder, &remote_parent(parent))
    }
}

/// What is passed on when the relay does not trace: the caller's context
/// as it came, so a webhook request still carries the application's trace.
fn passed_on(parent: Option<TraceParent>) -> Option<String> {
    parent.map(|p| p.to_string())
}

/// A publish request's span, and the context its events are stored with.
pub struct PublishTrace {
    span: Option<PublishSpans>,
    /// What the request's events store as their `traceparent` when they
    /// name none themselves.
    pub traceparent: Option<String>,
}

struct PublishSpans {
    tracer: SdkTracer,
    cx: Context,
}

impl PublishTrace {
    /// The group commit's span, a child of the request's: from the events'
    /// handing to the committer to their commit. Ended when dropped.
    pub fn group_commit(&self) -> Option<opentelemetry_sdk::trace::Span> {
        let spans = self.span.as_ref()?;
        Some(
            spans
                .tracer
                .span_builder("eventrelay.group_commit")
                .with_kind(SpanKind::Internal)
                .start_with_context(&spans.tracer, &spans.cx),
        )
    }

    /// Ends the request's span, as failed when `error` says why.
    pub fn end(self, error: Option<&str>) {
        if let Some(spans) = self.span {
            let span = spans.cx.span();
            if let Some(error) = error {
                span.set_status(Status::error(error.to_owned()));
            }
            span.end();
        }
    }
}

/// A webhook attempt's span and the `traceparent` its request carries.
pub struct AttemptTrace {
    span: Option<opentelemetry_sdk::trace::Span>,
    pub traceparent: Option<String>,
}

impl AttemptTrace {
    /// Ends the span with the attempt's outcome.
    pub fn end(self, attributes: Vec<KeyValue>, failed: Option<&str>) {
        if let Some(mut span) = self.span {
            span.set_attributes(attributes);
            if let Some(reason) = failed {
                span.set_status(Status::error(reason.to_owned()));
            }
            span.end();
        }
    }
}

/// A context whose parent is the remote span of `parent`, or an empty one
/// (a new trace) without it.
fn remote_parent(parent: Option<TraceParent>) -> Context {
    match parent {
        Some(parent) => Context::new().with_remote_span_context(SpanContext::new(
            TraceId::from_bytes(parent.trace_id.to_be_bytes()),
            SpanId::from_bytes(parent.parent_id.to_be_bytes()),
            TraceFlags::new(parent.flags),
            true,
            TraceState::default(),
        )),
        None => Context::new(),
    }
}

/// A span's context as a `traceparent`, `None` when it is not valid.
fn traceparent_of(span: &SpanContext) -> Option<String> {
    span.is_valid().then(|| {
        TraceParent {
            trace_id: u128::from_be_bytes(span.trace_id().to_bytes()),
            parent_id: u64::from_be_bytes(span.span_id().to_bytes()),
            flags: span.trace_flags().to_u8(),
        }
        .to_string()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_traces_path_is_added_once() {
        assert_eq!(
            TelemetryConfig::traces_url("http://c:4318"),
            "http://c:4318/v1/traces"
        );
        assert_eq!(
            TelemetryConfig::traces_url("http://c:4318/"),
            "http://c:4318/v1/traces"
        );
        assert_eq!(
            TelemetryConfig::traces_url("http://c:4318/v1/traces"),
            "http://c:4318/v1/traces"
        );
    }

    #[test]
    fn bad_settings_are_named() {
        let bad = |edit: fn(&mut TelemetryConfig)| {
            let mut config = TelemetryConfig::default();
            edit(&mut config);
            config.check().unwrap_err().0
        };
        assert_eq!(bad(|c| c.sample_ratio = 1.5), "telemetry.sample_ratio");
        assert_eq!(bad(|c| c.sample_ratio = f64::NAN), "telemetry.sample_ratio");
        assert_eq!(
            bad(|c| c.service_name = " ".into()),
            "telemetry.service_name"
        );
        assert_eq!(
            bad(|c| c.otlp_endpoint = Some("collector:4318".into())),
            "telemetry.otlp_endpoint"
        );
        assert_eq!(bad(|c| c.export_delay_ms = 0), "telemetry.export_delay_ms");
        assert!(TelemetryConfig::default().check().is_ok());
    }

    #[test]
    fn off_passes_the_callers_context_on_unchanged() {
        let parent =
            TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        let off = Tracing::default();
        assert_eq!(
            off.publish(Some(parent), 1, SystemTime::now()).traceparent,
            Some(parent.to_string())
        );
        assert_eq!(off.publish(None, 1, SystemTime::now()).traceparent, None);
        assert!(
            off.event(Some(parent), None, SystemTime::now(), Vec::new)
                .is_none()
        );
        assert_eq!(
            off.webhook_attempt(Some("garbage"), vec![]).traceparent,
            None
        );
    }
}
