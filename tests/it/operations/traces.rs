//! Traces end to end, against a real OTLP/HTTP endpoint: a local receiver
//! that takes what the relay's exporter posts and decodes the protobuf. One
//! trace must go from the publish (an HTTP request, SQL `emit`, an
//! ephemeral event) through the relay's spans to the webhook receiver's
//! `traceparent`, each span under the right parent.

use std::collections::HashMap;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;
use serde_json::{Value, json};

use crate::support::receiver::Receiver;
use crate::support::server::{SseStream, TestServer, token};
use crate::support::{TestDb, eventually, test_in_both_wakeup_modes};
use eventrelay::config::Config;
use eventrelay::publisher::NewEvent;
use eventrelay::store::WakeupMode;
use eventrelay::webhooks::NewSubscription;
use eventrelay::wire::TraceParent;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const CALLER: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// A relay that exports every trace to `otlp` and sends `order.*` webhooks
/// to `hooks`.
fn traced(otlp: &Receiver, hooks: &Receiver) -> impl FnOnce(&mut Config) {
    let endpoint = otlp.url.trim_end_matches("/hook").to_owned();
    let hooks = hooks.url.clone();
    move |config: &mut Config| {
        config.telemetry.otlp_endpoint = Some(endpoint);
        config.telemetry.export_delay_ms = 50;
        config.telemetry.service_name = "relay-under-test".into();
        config.webhooks.allow_private_networks = true;
        config.webhooks.subscriptions = vec![NewSubscription {
            id: "receiver".into(),
            url: hooks,
            secret: SECRET.into(),
            types: vec!["order.*".into()],
            scope_key: None,
            max_per_second: None,
            ordering: Default::default(),
            ordering_max_block_secs: None,
        }];
    }
}

/// A relay that exports every trace, with a subscriber of `org-1`.
struct Traced {
    db: TestDb,
    _cluster: Option<crate::support::cluster::Cluster>,
    otlp: Receiver,
    hooks: Receiver,
    server: TestServer,
    stream: SseStream,
}

impl Traced {
    async fn start(mode: WakeupMode) -> Traced {
        let (db, cluster) = TestDb::for_mode(mode).await;
        let otlp = Receiver::start([]);
        let hooks = Receiver::start([]);
        let server = TestServer::start(&db, traced(&otlp, &hooks));
        server.ready().await;
        let (stream, _) = server
            .subscribe(&token("alice", "org-1", json!({})), None, "")
            .await;
        Traced {
            db,
            _cluster: cluster,
            otlp,
            hooks,
            server,
            stream,
        }
    }
}

/// Every span the endpoint has received, by name (a name seen twice keeps
/// both), after checking each request is a valid OTLP export of this
/// relay's service.
fn spans(otlp: &Receiver) -> HashMap<String, Vec<Span>> {
    let mut by_name: HashMap<String, Vec<Span>> = HashMap::new();
    for request in otlp.received() {
        assert_eq!(request.path, "/v1/traces");
        assert_eq!(request.headers["content-type"], "application/x-protobuf");
        let export = ExportTraceServiceRequest::decode(&request.body[..])
            .expect("the body is an OTLP protobuf export");
        for resource in export.resource_spans {
            let service = resource
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|a| a.key == "service.name")
                .and_then(|a| a.value.as_ref()?.value.clone());
            assert_eq!(
                service,
                Some(AnyValue::StringValue("relay-under-test".into()))
            );
            for span in resource.scope_spans.into_iter().flat_map(|s| s.spans) {
                by_name.entry(span.name.clone()).or_default().push(span);
            }
        }
    }
    by_name
}

/// Waits until the endpoint has every span named in `names`.
async fn wait_for_spans(otlp: &Receiver, names: &[&str]) -> HashMap<String, Vec<Span>> {
    eventually(&format!("the spans {names:?} are exported"), async || {
        let spans = spans(otlp);
        names
            .iter()
            .all(|name| spans.contains_key(*name))
            .then_some(spans)
    })
    .await
}

/// Prints the spans as a trace viewer lists them, each with its start
/// after the trace's first and its length, for the reader.
fn print_trace(spans: &HashMap<String, Vec<Span>>) {
    let all: Vec<&Span> = spans.values().flatten().collect();
    let depth = |span: &Span| {
        let mut depth = 0;
        let mut parent = &span.parent_span_id;
        while let Some(up) = all.iter().find(|s| &s.span_id == parent) {
            depth += 1;
            parent = &up.parent_span_id;
        }
        depth
    };
    let mut listed: Vec<(u64, usize, &Span)> = all
        .iter()
        .map(|span| (span.start_time_unix_nano, depth(span), *span))
        .collect();
    listed.sort_by_key(|(start, depth, _)| (*start, *depth));
    let first = listed.first().map_or(0, |(start, _, _)| *start);
    let ms = |nanos: u64| nanos as f64 / 1e6;
    for (start, depth, span) in listed {
        println!(
            "{:indent$}{:<32} +{:>8.3} ms {:>8.3} ms",
            "",
            span.name,
            ms(start - first),
            ms(span.end_time_unix_nano - start),
            indent = depth * 2
        );
    }
}

fn one<'a>(spans: &'a HashMap<String, Vec<Span>>, name: &str) -> &'a Span {
    let found = &spans[name];
    assert_eq!(found.len(), 1, "one {name} span: {found:?}");
    &found[0]
}

fn trace_id_of(traceparent: &str) -> Vec<u8> {
    TraceParent::parse(traceparent)
        .expect("a valid traceparent")
        .trace_id
        .to_be_bytes()
        .to_vec()
}

fn parent_id_of(traceparent: &str) -> Vec<u8> {
    TraceParent::parse(traceparent)
        .expect("a valid traceparent")
        .parent_id
        .to_be_bytes()
        .to_vec()
}

/// The relay's delivery spans for one event: `eventrelay.deliver` under
/// `parent`, with its read, fan-out and write spans under it, all in the
/// trace `trace_id`. Answers the deliver span.
fn assert_delivery_under<'a>(
    spans: &'a HashMap<String, Vec<Span>>,
    trace_id: &[u8],
    parent: &[u8],
) -> &'a Span {
    let deliver = one(spans, "eventrelay.deliver");
    assert_eq!(deliver.trace_id, trace_id);
    assert_eq!(
        deliver.parent_span_id, parent,
        "deliver continues the event's context"
    );
    for stage in ["eventrelay.read", "eventrelay.fan_out", "eventrelay.write"] {
        let span = one(spans, stage);
        assert_eq!(span.trace_id, trace_id, "{stage}");
        assert_eq!(
            span.parent_span_id, deliver.span_id,
            "{stage} is under deliver"
        );
        assert!(
            span.start_time_unix_nano >= deliver.start_time_unix_nano
                && span.end_time_unix_nano <= deliver.end_time_unix_nano,
            "{stage} lies within deliver"
        );
    }
    deliver
}

/// The webhook attempt's span, under `parent` in `trace_id`, and the
/// request the receiver got, whose `traceparent` names the attempt.
async fn assert_attempt_under(
    spans: &HashMap<String, Vec<Span>>,
    hooks: &Receiver,
    trace_id: &[u8],
    parent: &[u8],
) {
    let attempt = one(spans, "eventrelay.webhook.attempt");
    assert_eq!(attempt.trace_id, trace_id);
    assert_eq!(attempt.parent_span_id, parent);
    let request = hooks.wait_for(1).await.remove(0);
    let traceparent = &request.headers["traceparent"];
    assert_eq!(
        trace_id_of(traceparent),
        trace_id,
        "the receiver joins the trace"
    );
    assert_eq!(parent_id_of(traceparent), attempt.span_id);
    let body: Value = serde_json::from_slice(&request.body).unwrap();
    assert!(body.get("traceparent").is_none(), "the body leaves it out");
}

test_in_both_wakeup_modes!(one_trace_goes_from_an_http_publish_to_the_webhook_receiver);

async fn one_trace_goes_from_an_http_publish_to_the_webhook_receiver(mode: WakeupMode) {
    let mut traced = Traced::start(mode).await;

    let response = reqwest::Client::new()
        .post(traced.server.url("/v1/events"))
        .bearer_auth(crate::support::server::PUBLISH_TOKEN)
        .header("traceparent", CALLER)
        .json(&json!({"type": "order.created", "scopeKey": "org-1", "lane": "durable", "data": {}}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let frame = traced.stream.next_event().await;
    assert!(
        !frame.data.contains("traceparent"),
        "a stream's frames never carry it: {}",
        frame.data
    );

    let spans = wait_for_spans(
        &traced.otlp,
        &[
            "eventrelay.publish",
            "eventrelay.group_commit",
            "eventrelay.deliver",
            "eventrelay.write",
            "eventrelay.webhook.attempt",
        ],
    )
    .await;
    print_trace(&spans);
    let trace_id = trace_id_of(CALLER);
    let publish = one(&spans, "eventrelay.publish");
    assert_eq!(publish.trace_id, trace_id);
    assert_eq!(
        publish.parent_span_id,
        parent_id_of(CALLER),
        "the caller's span is its parent"
    );
    let group_commit = one(&spans, "eventrelay.group_commit");
    assert_eq!(group_commit.parent_span_id, publish.span_id);
    assert_eq!(group_commit.trace_id, trace_id);
    assert_delivery_under(&spans, &trace_id, &publish.span_id);
    assert_attempt_under(&spans, &traced.hooks, &trace_id, &publish.span_id).await;
    let stored: Vec<Option<String>> = traced
        .db
        .column("SELECT traceparent FROM {schema}.outbox")
        .await;
    assert_eq!(parent_id_of(stored[0].as_deref().unwrap()), publish.span_id);
}

test_in_both_wakeup_modes!(an_event_emitted_in_sql_with_a_traceparent_continues_its_trace);

async fn an_event_emitted_in_sql_with_a_traceparent_continues_its_trace(mode: WakeupMode) {
    let mut traced = Traced::start(mode).await;

    let client = traced.db.connect().await;
    let emit = format!(
        "SELECT {}.emit('order.created', 'org-1', '{{}}'::jsonb, traceparent => $1)",
        traced.db.schema
    );
    client.execute(&emit, &[&CALLER]).await.unwrap();
    traced.stream.next_event().await;

    let spans = wait_for_spans(
        &traced.otlp,
        &[
            "eventrelay.deliver",
            "eventrelay.write",
            "eventrelay.webhook.attempt",
        ],
    )
    .await;
    assert!(
        !spans.contains_key("eventrelay.publish"),
        "no publish request here"
    );
    let trace_id = trace_id_of(CALLER);
    let caller = parent_id_of(CALLER);
    assert_delivery_under(&spans, &trace_id, &caller);
    assert_attempt_under(&spans, &traced.hooks, &trace_id, &caller).await;
}

test_in_both_wakeup_modes!(an_ephemeral_event_carries_its_trace_in_the_sealed_notification);

async fn an_ephemeral_event_carries_its_trace_in_the_sealed_notification(mode: WakeupMode) {
    let mut traced = Traced::start(mode).await;

    traced
        .db
        .emit(
            NewEvent::ephemeral("cursor.moved", "org-1", json!({"x": 1})).with_traceparent(CALLER),
        )
        .await;
    let frame = traced.stream.next_event().await;
    assert_eq!(frame.event.as_deref(), Some("cursor.moved"));
    assert!(!frame.data.contains("traceparent"), "{}", frame.data);

    let spans = wait_for_spans(&traced.otlp, &["eventrelay.deliver", "eventrelay.write"]).await;
    assert_delivery_under(&spans, &trace_id_of(CALLER), &parent_id_of(CALLER));
}

#[tokio::test]
async fn a_malformed_traceparent_is_ignored_never_an_error() {
    let db = TestDb::new().await;
    let otlp = Receiver::start([]);
    let hooks = Receiver::start([]);
    let server = TestServer::start(&db, |config: &mut Config| {
        traced(&otlp, &hooks)(config);
        // Only traces with a valid parent are recorded.
        config.telemetry.sample_ratio = 0.0;
    });
    server.ready().await;
    let response = reqwest::Client::new()
        .post(server.url("/v1/events"))
        .bearer_auth(crate::support::server::PUBLISH_TOKEN)
        .header("traceparent", "00-not-a-trace-01")
        .json(&json!({"type": "order.created", "scopeKey": "org-1", "lane": "durable"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200, "published all the same");
    let client = db.connect().await;
    for broken in [
        "garbage",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
    ] {
        let emit = format!(
            "SELECT {}.emit('order.created', 'org-1', traceparent => $1)",
            db.schema
        );
        client.execute(&emit, &[&broken]).await.unwrap();
    }
    let stored: Vec<Option<String>> = db
        .column("SELECT traceparent FROM {schema}.outbox ORDER BY seq")
        .await;
    // The request's trace started at the relay instead, unsampled at a
    // ratio of 0, and its events carry that decision on.
    let relays_own = TraceParent::parse(stored[0].as_deref().unwrap()).unwrap();
    assert!(!relays_own.sampled());
    assert_eq!(stored[1..], [None, None], "nothing malformed is stored");
    let batch = format!(
        "SELECT seq FROM {}.emit_batch(ARRAY[NULL, NULL]::uuid[], ARRAY['t.a', 't.b'],
                 ARRAY['org-1', 'org-1'], ARRAY['{{}}', '{{}}']::jsonb[], ARRAY[NULL, NULL]::jsonb[],
                 ARRAY[NULL, NULL]::jsonb[], ARRAY[NULL, NULL]::timestamptz[],
                 traceparents => ARRAY[$1, 'garbage'])",
        db.schema
    );
    client.execute(&batch, &[&CALLER]).await.unwrap();
    let batched: Vec<Option<String>> = db
        .column("SELECT traceparent FROM {schema}.outbox WHERE type LIKE 't.%' ORDER BY seq")
        .await;
    assert_eq!(
        batched,
        [Some(CALLER.to_owned()), None],
        "emit_batch keeps the valid one"
    );
    let requests = hooks.wait_for(3).await;
    for request in &requests {
        // Each attempt carries its own span's context, as any traced HTTP
        // client does, unsampled like everything here.
        let sent = TraceParent::parse(&request.headers["traceparent"]).unwrap();
        assert!(!sent.sampled());
        let body: Value = serde_json::from_slice(&request.body).unwrap();
        assert_eq!(
            sent.trace_id == relays_own.trace_id,
            body["seq"] == 1,
            "only the published event's attempt continues the request's trace"
        );
    }
    // Nothing was sampled: no span at all.
    assert!(spans(&otlp).is_empty(), "{:?}", spans(&otlp).keys());
}
