//! Fan-out over HTTP/2 next to HTTP/1.1 (`--only http2`), at the same rate
//! and subscriber count: plain HTTP/1.1, then a relay serving TLS as
//! browsers reach it, over HTTP/1.1 (a connection per subscriber) and over
//! HTTP/2 with one stream per connection and with ten, as a browser with
//! many tabs has. Over TLS both protocols go through the same client
//! library, so those rows differ only in the protocol.

use crate::BenchResult;
use crate::context::Context;
use crate::publish::Pace;
use crate::report::{Table, size, verdict};
use crate::scenarios::fanout::{self, FanoutFigures, FanoutPlan, Server, fanout_summary};
/// Fan-out over HTTP/2 next to HTTP/1.1, at the same rate and subscriber
/// count: plain HTTP/1.1 (the fan-out rows' client), then a relay serving
/// TLS as browsers reach it, over HTTP/1.1 (a connection per subscriber)
/// and over HTTP/2 with one stream per connection and with ten, as a
/// browser with many tabs has. Over TLS both protocols go through the same
/// client library, so those rows differ only in the protocol.
pub async fn rows(cx: &Context, table: &mut Table) -> BenchResult<()> {
    let subscribers = cx.scale.small_fanout;
    let mut baseline: Option<FanoutFigures> = None;
    for (label, tls, streams) in [
        ("HTTP/1.1", false, None),
        ("HTTPS, HTTP/1.1", true, None),
        ("HTTPS, HTTP/2, 1 stream per connection", true, Some(1)),
        ("HTTPS, HTTP/2, 10 streams per connection", true, Some(10)),
    ] {
        let mut settings = cx.settings();
        if tls {
            settings = settings.with_tls(&cx.args.work_dir)?;
        }
        let relay = cx.start_relay(settings).await?;
        let server = if tls {
            Server::EventrelayTls {
                address: relay.address(),
                pids: vec![relay.pid()],
                http2_streams_per_connection: streams,
            }
        } else {
            Server::of(&relay)
        };
        eprintln!("fan-out {subscribers}, 100 ev/s, {label}");
        let plan = FanoutPlan {
            subscribers,
            scopes: 1,
            scope_prefix: format!("proto-{tls}-{streams:?}"),
            pace: Pace::PerSecond(100.0),
            duration: cx.scale.fixed_run,
            writers: 4,
            source: cx.emit_source(),
        };
        let f = fanout::run(&plan, &server).await?;
        let connections = subscribers.div_ceil(streams.unwrap_or(1));
        table.add(
            format!(
                "eventrelay fan-out {subscribers} subs over {label} ({connections} connections), 1 scope, 100 ev/s, emit (commit-to-receive)"
            ),
            fanout_summary(&f),
            format!("all received: {}", verdict(f.delivered == f.expected)),
        );
        if !tls {
            continue;
        }
        match &baseline {
            None => baseline = Some(f),
            Some(h1) => table.add(
                format!("side by side, {subscribers} subs, 100 ev/s: {label} / HTTPS, HTTP/1.1"),
                format!(
                    "deliveries/s {:.2}× · {} · RSS {} vs {}",
                    f.deliveries_per_second / h1.deliveries_per_second.max(1.0),
                    fanout::against(&f, h1),
                    size(f.rss_bytes as f64),
                    size(h1.rss_bytes as f64)
                ),
                "–".to_owned(),
            ),
        }
    }
    Ok(())
}
