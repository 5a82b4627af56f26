//! `eventrelay-bench`: runs every scenario against a release relay (and
//! nchan when given) for a bounded time and prints one Markdown table.
//! `bench/run` builds it, starts Postgres and nginx/nchan, and calls it.

#![allow(
    clippy::print_stdout,
    reason = "the figures table is this tool's output"
)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use eventrelay::store::WakeupMode;
use eventrelay_bench::alloc_counter::CountingAllocator;
use eventrelay_bench::database::{create_schema, create_schema_for, drop_schema};
use eventrelay_bench::publish::{Pace, Source};
use eventrelay_bench::relay_process::{RelayProcess, RelaySettings};
use eventrelay_bench::report::{Table, median, ms, size, verdict};
use eventrelay_bench::scenarios::emit_cost::WriteKind;
use eventrelay_bench::scenarios::fanout::{self, FanoutFigures, FanoutPlan, Server};
use eventrelay_bench::scenarios::floor;
use eventrelay_bench::scenarios::paired_fanout::{self, PairedPlan};
use eventrelay_bench::scenarios::storm::StormPlan;
use eventrelay_bench::scenarios::{
    connection_heap, emit_cost, outage, pools, publish_throughput, replay, resume_cost, seal_cost,
    standby, storm, streams, tail_memory, tails_budget, webhooks,
};
use eventrelay_bench::webhook_receiver::WebhookReceiver;
use eventrelay_bench::{BenchResult, proc_stats};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

#[derive(Parser, Debug)]
#[command(about = "eventrelay performance harness")]
struct Args {
    /// Smaller subscriber counts and shorter runs.
    #[arg(long)]
    quick: bool,
    /// The release `eventrelay` binary.
    #[arg(long)]
    relay_bin: PathBuf,
    #[arg(long, env = "DATABASE_URL")]
    database_url: String,
    /// nchan's loopback address (`/pub` publishes, `/sub` subscribes).
    #[arg(long)]
    nchan_address: Option<SocketAddr>,
    /// nginx's master pid; CPU and RSS are summed over its workers.
    #[arg(long)]
    nchan_pid: Option<u32>,
    /// Where relay configurations and logs go.
    #[arg(long, default_value = "/tmp/eventrelay-bench")]
    work_dir: PathBuf,
    /// An earlier release `eventrelay` binary, whose HTTP publish
    /// throughput the publish rows measure side by side (bench/run builds
    /// one when BASELINE_REV names a commit).
    #[arg(long)]
    baseline_relay_bin: Option<PathBuf>,
    /// A Postgres with `wal_level = logical`, for the wake-up modes side by
    /// side (bench/run starts a throwaway one); without it they are skipped.
    #[arg(long)]
    logical_database_url: Option<String>,
    /// A Postgres 16+ primary with `wal_level = logical` and a streaming
    /// standby of it (`hot_standby_feedback = on`), for relays decoding on
    /// the standby (bench/run starts both); without them that is skipped.
    #[arg(long)]
    standby_primary_url: Option<String>,
    #[arg(long)]
    standby_url: Option<String>,
    /// The primary's data directory (its postmaster.pid).
    #[arg(long)]
    standby_primary_data: Option<PathBuf>,
    /// Run only these scenarios (comma separated: tail, emit, publish,
    /// wakeup, fanout, floor, pools, http2, scopes, replay, resume, webhooks,
    /// storm, memory, streams, streams-box, seal, standby, outage;
    /// wakeup-latency is the wake-up modes' commit-to-receive rows without
    /// their emit-cost rounds; box, 100,000 streams over 6 relays, runs only
    /// when named). `eventrelay-bench streams-client` is the streams
    /// scenario's child process, started by it.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Rounds of the floor scenario (each side once per round, the order
    /// turning from round to round).
    #[arg(long, default_value_t = 3)]
    floor_rounds: usize,
    /// Run nchan twice in every round of the floor scenario: its second
    /// run over its first shows how far two runs of one server land apart
    /// on this machine, beside each lane's figures over nchan's.
    #[arg(long)]
    floor_control: bool,
    /// The floor scenario's loads, as subscribers `x` events per second
    /// (comma separated, e.g. `1000x100,10000x2`); by default its four
    /// rows, scaled down with --quick.
    #[arg(long, value_delimiter = ',', value_parser = parse_load)]
    floor_loads: Vec<(usize, f64)>,
    /// Streams of the box scenario (default 100,000; 12,000 with --quick).
    #[arg(long)]
    box_streams: Option<usize>,
    /// `database.pool_size` of the box scenario's relays (default: chosen
    /// from what Postgres has free, at most 8).
    #[arg(long)]
    box_pool_size: Option<usize>,
    /// How the box scenario's subscribers reconnect: `jittered` (as
    /// eventrelay's browser client, the default) or `immediate` (at once,
    /// retrying every 50 ms while nothing listens).
    #[arg(long, default_value = "jittered")]
    box_reconnect: String,
    /// The box scenario's relays' `http.header_timeout_secs` (default 60).
    #[arg(long)]
    box_header_timeout: Option<u64>,
}

/// Sizes and durations of one run.
struct Scale {
    small_fanout: usize,
    large_fanout: usize,
    scopes: usize,
    per_scope: usize,
    fixed_run: Duration,
    unthrottled_run: Duration,
    emit_run: Duration,
    replay_events: usize,
    webhook_events: usize,
}

impl Scale {
    fn of(quick: bool) -> Scale {
        if quick {
            Scale {
                small_fanout: 200,
                large_fanout: 1_000,
                scopes: 100,
                per_scope: 10,
                fixed_run: Duration::from_secs(3),
                unthrottled_run: Duration::from_secs(2),
                emit_run: Duration::from_secs(1),
                replay_events: 2_000,
                webhook_events: 300,
            }
        } else {
            Scale {
                small_fanout: 1_000,
                large_fanout: 10_000,
                scopes: 1_000,
                per_scope: 10,
                fixed_run: Duration::from_secs(10),
                unthrottled_run: Duration::from_secs(5),
                emit_run: Duration::from_secs(3),
                replay_events: 10_000,
                webhook_events: 2_000,
            }
        }
    }
}

fn main() -> BenchResult<()> {
    // Client processes of the `box` and `streams` scenarios, started by
    // the load tool.
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some(eventrelay_bench::box_client::SUBCOMMAND) {
        return eventrelay_bench::box_client::main(&argv[2..]);
    }
    if argv.get(1).map(String::as_str) == Some("streams-client") {
        return tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?
            .block_on(streams::client_main(&argv[2..]));
    }
    let args = Args::parse();
    let wanted = |name: &str| args.only.is_empty() || args.only.iter().any(|o| o == name);
    let mut table = Table::default();
    // Before any runtime exists, so no other thread allocates meanwhile.
    if wanted("tail") {
        tail_rows(&mut table);
        tails_budget_row(&mut table, if args.quick { 1_000 } else { 10_000 });
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let schema = format!("bench_{}", std::process::id());
    let result = runtime.block_on(async {
        std::fs::create_dir_all(&args.work_dir)?;
        create_schema(&args.database_url, &schema).await?;
        let outcome = run_scenarios(&args, &schema, &mut table, &wanted).await;
        drop_schema(&args.database_url, &schema).await;
        outcome
    });
    println!("\n{}", table.render());
    println!(
        "machine: {} cores, {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        cpu_model()
    );
    result
}

async fn run_scenarios(
    args: &Args,
    schema: &str,
    table: &mut Table,
    wanted: &dyn Fn(&str) -> bool,
) -> BenchResult<()> {
    let scale = Scale::of(args.quick);
    let db = args.database_url.as_str();
    if wanted("emit") {
        emit_cost::prepare(db, schema).await?;
        for writers in [1, 8, 32] {
            eprintln!("emit cost, {writers} writers");
            let f = emit_cost::run(db, schema, writers, scale.emit_run).await?;
            let ratio = f.publisher_tps / f.plain_tps;
            let sql_ratio = f.sql_tps / f.plain_tps;
            let target = if writers == 8 {
                format!(
                    "≥ 0.8× plain at 8 writers: {}",
                    verdict(ratio >= 0.8 && sql_ratio >= 0.8)
                )
            } else {
                "–".to_owned()
            };
            table.add(
                format!("emit cost, {writers} writer(s)"),
                format!(
                    "plain {:.0} tx/s · with publisher emit {:.0} tx/s ({ratio:.2}×) · with SQL emit() {:.0} tx/s ({sql_ratio:.2}×)",
                    f.plain_tps, f.publisher_tps, f.sql_tps
                ),
                target,
            );
        }
    }
    if wanted("publish") {
        publish_rows(args, schema, &scale, table).await?;
    }
    if wanted("seal") {
        seal_rows(args, schema, table).await?;
    }
    if wanted("wakeup") || wanted("wakeup-latency") {
        // `wakeup-latency` alone skips the emit-cost rounds.
        let emit_cost = args.only.is_empty() || wanted("wakeup");
        wakeup_rows(args, &scale, table, emit_cost).await?;
    }
    if wanted("fanout") {
        fanout_rows(args, schema, &scale, table).await?;
    }
    if wanted("floor") {
        floor_rows(args, schema, &scale, table).await?;
    }
    if wanted("pools") {
        pool_rows(args, schema, &scale, table).await?;
    }
    if wanted("http2") {
        http2_rows(args, schema, &scale, table).await?;
    }
    if wanted("memory") {
        let n = if args.quick { 1_000 } else { 5_000 };
        eprintln!("heap per idle stream: {n} streams");
        let heap = connection_heap::measure(db, schema, n).await?;
        // The client's half of each connection is a bare socket's half.
        let relay_side = heap.stream - heap.bare_socket / 2.0;
        table.add(
            format!("heap per idle stream, relay side ({n} streams, in-process, counted allocator)"),
            format!(
                "{} allocated per stream (a bare TCP connection's two ends: {}); actix-http's read and write buffers are 8 KiB each of it",
                size(relay_side),
                size(heap.bare_socket)
            ),
            "–".to_owned(),
        );
        let blocks: Vec<String> = heap
            .blocks
            .iter()
            .map(|(size, count)| format!("{count:.1} × ≤ {size} B"))
            .collect();
        table.add(
            "heap per idle stream, by block size (both ends, in-process)",
            blocks.join(" · "),
            "–".to_owned(),
        );
        let carrying = 100;
        let events = 20_000;
        eprintln!("heap per stream carrying {events} durable events: {carrying} streams");
        let carried = connection_heap::measure_carried(db, schema, carrying, events).await?;
        table.add(
            format!(
                "heap a live stream adds carrying {} durable events ({carrying} streams, in-process, after a warm-up)",
                carried.events
            ),
            format!("{} per stream", size(carried.growth)),
            "–".to_owned(),
        );
        let surge = connection_heap::measure_surge(db, schema, n).await?;
        let blocks: Vec<String> = surge
            .blocks
            .iter()
            .map(|(size, count)| format!("{count:.2} × ≤ {size} B"))
            .collect();
        table.add(
            format!(
                "heap per stream at the peak of {n} connecting at once, beyond what they hold idle"
            ),
            format!(
                "{} per stream: {}",
                size(surge.transient),
                blocks.join(" · ")
            ),
            "–".to_owned(),
        );
    }
    if wanted("storm") {
        storm_rows(args, schema, &scale, table).await?;
    }
    if wanted("streams") {
        streams_rows(args, schema, table).await?;
    }
    if wanted("streams-box") {
        streams_box_rows(args, schema, table).await?;
    }
    if wanted("standby") {
        standby_rows(args, &scale, table).await?;
    }
    if wanted("outage") {
        outage_row(args, table).await?;
    }
    // 100,000 streams over 6 relays: only when asked for by name.
    if args.only.iter().any(|only| only == "box") {
        let mut plan = eventrelay_bench::scenarios::box_scale::BoxPlan::of(args.quick);
        plan.streams = args.box_streams.unwrap_or(plan.streams);
        plan.pool_size = args.box_pool_size;
        plan.reconnect = eventrelay_bench::box_client::Reconnect::parse(&args.box_reconnect)?;
        plan.header_timeout_secs = args.box_header_timeout.unwrap_or(plan.header_timeout_secs);
        eventrelay_bench::scenarios::box_scale::rows(
            &plan,
            &args.relay_bin,
            &args.work_dir,
            db,
            schema,
            table,
        )
        .await?;
    }
    if wanted("scopes") {
        let subscribers = scale.scopes * scale.per_scope;
        let relay = start_relay(args, RelaySettings::new(db, schema)).await?;
        let rate = 200.0;
        eprintln!("many scopes: {} × {}", scale.scopes, scale.per_scope);
        let plan = FanoutPlan {
            subscribers,
            scopes: scale.scopes,
            scope_prefix: "many".to_owned(),
            pace: Pace::PerSecond(rate),
            duration: scale.fixed_run,
            writers: 4,
            source: emit_source(db, schema),
        };
        let f = fanout::run(&plan, &relay_server(&relay)).await?;
        table.add(
            format!(
                "many scopes: {} scopes × {} subscribers, {rate:.0} ev/s spread over them, emit",
                scale.scopes, scale.per_scope
            ),
            fanout_summary(&f),
            format!("all received: {}", verdict(f.delivered == f.expected)),
        );
    }
    if wanted("replay") {
        for (label, events, bytes) in [
            ("tail", scale.replay_events * 2, 256 * 1024 * 1024),
            ("outbox", 1, 1024),
        ] {
            eprintln!("replay from the {label}");
            let mut settings = RelaySettings::new(db, schema);
            settings.tail_events = events;
            settings.tail_bytes = bytes;
            settings.replay_lookback = 0;
            settings.queue_capacity = 16_384;
            let relay = start_relay(args, settings).await?;
            let f = replay::run(
                &relay,
                db,
                schema,
                &format!("replay-{label}"),
                scale.replay_events,
            )
            .await?;
            table.add(
                format!(
                    "replay {} events, Last-Event-ID, {label} configured",
                    f.events
                ),
                format!(
                    "{} received in {} ({:.0} events/s), served from the {}",
                    f.received,
                    ms(f.took),
                    f.received as f64 / f.took.as_secs_f64(),
                    f.served_from
                ),
                format!("all received: {}", verdict(f.received == f.events)),
            );
        }
    }
    if wanted("resume") {
        // Each relay in a schema of its own, which it migrates at start;
        // the earlier release beside this one when BASELINE_REV names it.
        let mut relays = vec![("this build", args.relay_bin.clone(), false)];
        if let Some(binary) = &args.baseline_relay_bin {
            relays.push(("the earlier release", binary.clone(), true));
        }
        for (label, binary, baseline) in relays {
            eprintln!("resumes against {label}");
            let schema = eventrelay_bench::database::unique_schema("bench_resume");
            let mut settings = RelaySettings::new(db, &schema);
            settings.baseline = baseline;
            let relay = RelayProcess::start(&binary, &args.work_dir, &settings).await?;
            let f = resume_cost::run(&relay, db, &schema, 20).await;
            drop(relay);
            drop_schema(db, &schema).await;
            let f = f?;
            table.add(
                format!(
                    "{} resumes after 200 ms away, 100 of 500 events/s in the scope, {label}",
                    f.resumes
                ),
                format!(
                    "{:.1} events sent again per resume (at most {}), {} missed",
                    f.resent_mean, f.resent_max, f.missed
                ),
                format!("none missed: {}", verdict(f.missed == 0)),
            );
        }
    }
    if wanted("webhooks") {
        for dispatchers in [1, 2] {
            eprintln!("webhooks, {dispatchers} dispatcher process(es)");
            let receiver = WebhookReceiver::start().await?;
            let mut relays = Vec::new();
            for _ in 0..dispatchers {
                let mut settings = RelaySettings::new(db, schema);
                settings.webhook_url = Some(receiver.url.clone());
                relays.push(start_relay(args, settings).await?);
            }
            let f = webhooks::run(&receiver, dispatchers, db, schema, scale.webhook_events).await?;
            table.add(
                format!(
                    "webhooks, {} relay process(es) × 4 workers, signed, receiver answers 200",
                    f.dispatchers
                ),
                format!(
                    "{:.0} deliveries/s ({} of {} delivered)",
                    f.deliveries_per_second, f.delivered, f.events
                ),
                format!("all delivered: {}", verdict(f.delivered == f.events as u64)),
            );
        }
    }
    Ok(())
}

/// Fan-out at one scope: eventrelay (emit and HTTP publish) and nchan, at a
/// fixed rate for both sizes, then unthrottled, side by side.
async fn fanout_rows(
    args: &Args,
    schema: &str,
    scale: &Scale,
    table: &mut Table,
) -> BenchResult<()> {
    let db = args.database_url.as_str();
    let nchan = match (args.nchan_address, args.nchan_pid) {
        (Some(address), Some(master)) => {
            let mut pids = proc_stats::children_of(master);
            pids.push(master);
            Some((address, Server::Nchan { address, pids }))
        }
        _ => None,
    };
    let runs: [(usize, Pace, Duration, usize); 5] = [
        (
            scale.small_fanout,
            Pace::PerSecond(100.0),
            scale.fixed_run,
            4,
        ),
        (scale.large_fanout, Pace::PerSecond(2.0), scale.fixed_run, 4),
        (
            scale.large_fanout,
            Pace::PerSecond(10.0),
            scale.fixed_run,
            4,
        ),
        (
            scale.small_fanout,
            Pace::Unthrottled,
            scale.unthrottled_run,
            8,
        ),
        (
            scale.small_fanout,
            Pace::Unthrottled,
            scale.unthrottled_run,
            64,
        ),
    ];
    for (run, (subscribers, pace, duration, writers)) in runs.into_iter().enumerate() {
        let pace_label = match pace {
            Pace::PerSecond(rate) => format!("{rate:.0} ev/s"),
            Pace::Unthrottled => format!("unthrottled ({writers} publishers)"),
        };
        let mut eventrelay_http = None;
        for http in [false, true] {
            let relay = start_relay(args, RelaySettings::new(db, schema).in_own_session()).await?;
            let source = if http {
                Source::HttpPublish {
                    base: relay.base.clone(),
                }
            } else {
                emit_source(db, schema)
            };
            eprintln!("fan-out {subscribers}, {pace_label}, {}", source.label());
            let plan = FanoutPlan {
                subscribers,
                scopes: 1,
                scope_prefix: format!("fan-{run}-{http}"),
                pace,
                duration,
                writers,
                source: source.clone(),
            };
            let f = fanout::run(&plan, &relay_server(&relay)).await?;
            let target = fanout_target(subscribers, pace, http, &f);
            let clock = if http {
                "send-to-receive"
            } else {
                "commit-to-receive"
            };
            table.add(
                format!(
                    "eventrelay fan-out {subscribers} subs, 1 scope, {pace_label}, {} ({clock})",
                    source.label()
                ),
                fanout_summary(&f),
                target,
            );
            if subscribers == scale.large_fanout && !http {
                let per = f.idle_rss_per_connection;
                table.add(
                    format!(
                        "eventrelay idle connections: RSS per idle SSE connection at {subscribers}"
                    ),
                    size(per),
                    format!("≤ 16 KiB: {}", verdict(per <= 16.0 * 1024.0)),
                );
            }
            if http {
                eventrelay_http = Some(f);
            }
        }
        if let Some((address, server)) = &nchan {
            eprintln!("fan-out {subscribers}, {pace_label}, nchan");
            let plan = FanoutPlan {
                subscribers,
                scopes: 1,
                scope_prefix: format!("nchan-{run}"),
                pace,
                duration,
                writers,
                source: Source::Nchan {
                    url: format!("http://{address}/pub"),
                },
            };
            let f = fanout::run(&plan, server).await?;
            table.add(
                format!("nchan fan-out {subscribers} subs, 1 channel, {pace_label}, HTTP publish (send-to-receive)"),
                fanout_summary(&f),
                format!("all received: {}", verdict(f.delivered == f.expected)),
            );
            // The ephemeral lane too: no outbox row, one notification per
            // group commit.
            let mut ours_by_lane = vec![("HTTP publish", eventrelay_http)];
            let relay = start_relay(args, RelaySettings::new(db, schema).in_own_session()).await?;
            let source = Source::HttpPublishEphemeral {
                base: relay.base.clone(),
            };
            eprintln!("fan-out {subscribers}, {pace_label}, {}", source.label());
            let plan = FanoutPlan {
                subscribers,
                scopes: 1,
                scope_prefix: format!("fan-{run}-ephemeral"),
                pace,
                duration,
                writers,
                source: source.clone(),
            };
            let e = fanout::run(&plan, &relay_server(&relay)).await?;
            table.add(
                format!(
                    "eventrelay fan-out {subscribers} subs, 1 scope, {pace_label}, {} (send-to-receive)",
                    source.label()
                ),
                fanout_summary(&e),
                format!("all received: {}", verdict(e.delivered == e.expected)),
            );
            ours_by_lane.push(("HTTP publish, ephemeral lane", Some(e)));
            for (lane, ours) in ours_by_lane {
                let Some(ours) = ours else { continue };
                let ratio = ours.deliveries_per_second / f.deliveries_per_second.max(1.0);
                let target = if matches!(pace, Pace::Unthrottled) {
                    format!(
                        "≥ 1.5× nchan's, p99 below: {}",
                        verdict(ratio >= 1.5 && ours.latency.p99 < f.latency.p99)
                    )
                } else if subscribers == scale.large_fanout {
                    format!(
                        "deliveries/s ≥ nchan's, p99 below: {}",
                        verdict(ratio >= 0.995 && ours.latency.p99 < f.latency.p99)
                    )
                } else {
                    format!(
                        "deliveries/s ≥ nchan's, p50 ≤ 1.2× nchan's: {}",
                        verdict(
                            ratio >= 0.995
                                && ours.latency.p50.as_secs_f64()
                                    <= 1.2 * f.latency.p50.as_secs_f64()
                        )
                    )
                };
                table.add(
                    format!("side by side, {subscribers} subs, {pace_label}: eventrelay {lane} / nchan"),
                    format!(
                        "deliveries/s {ratio:.2}× · p50 {} vs {} · p99 {} vs {} · CPU s/1k {:.3} vs {:.3}",
                        ms(ours.latency.p50), ms(f.latency.p50), ms(ours.latency.p99), ms(f.latency.p99),
                        ours.cpu_seconds_per_1000, f.cpu_seconds_per_1000
                    ),
                    target,
                );
            }
        }
    }
    Ok(())
}

/// One load of `--floor-loads`: `1000x100` is 1,000 subscribers and 100
/// events per second.
fn parse_load(text: &str) -> Result<(usize, f64), String> {
    let invalid =
        || format!("`{text}` is not a load: write subscribers x events per second, as `1000x100`");
    let (subscribers, rate) = text.split_once(['x', '×']).ok_or_else(invalid)?;
    let subscribers: usize = subscribers.trim().parse().map_err(|_| invalid())?;
    let rate: f64 = rate.trim().parse().map_err(|_| invalid())?;
    if subscribers == 0 || !(rate > 0.0 && rate.is_finite()) {
        return Err(invalid());
    }
    Ok((subscribers, rate))
}

/// Latency at the floor: both lanes of HTTP publish against nchan, at
/// four loads, in alternating rounds, with the machine's commit time and
/// the relay's stage breakdown (see `scenarios::floor`).
async fn floor_rows(
    args: &Args,
    schema: &str,
    scale: &Scale,
    table: &mut Table,
) -> BenchResult<()> {
    let nchan = match (args.nchan_address, args.nchan_pid) {
        (Some(address), Some(master)) => {
            let mut pids = proc_stats::children_of(master);
            pids.push(master);
            Some((
                Server::Nchan { address, pids },
                format!("http://{address}/pub"),
            ))
        }
        _ => None,
    };
    let plan = floor::FloorPlan {
        relay_bin: &args.relay_bin,
        work_dir: &args.work_dir,
        database_url: &args.database_url,
        schema,
        nchan,
        loads: if args.floor_loads.is_empty() {
            vec![
                (scale.small_fanout, 100.0),
                (scale.small_fanout, 20.0),
                (scale.large_fanout, 10.0),
                (scale.large_fanout, 2.0),
            ]
        } else {
            args.floor_loads.clone()
        },
        duration: scale.fixed_run,
        rounds: args.floor_rounds,
        control: args.floor_control,
    };
    let figures = floor::run(&plan).await?;
    floor::report(&figures, table);
    Ok(())
}

/// Fan-out over HTTP/2 next to HTTP/1.1, at the same rate and subscriber
/// count: plain HTTP/1.1 (the fan-out rows' client), then a relay serving
/// TLS as browsers reach it, over HTTP/1.1 (a connection per subscriber)
/// and over HTTP/2 with one stream per connection and with ten, as a
/// browser with many tabs has. Over TLS both protocols go through the same
/// client library, so those rows differ only in the protocol.
async fn http2_rows(
    args: &Args,
    schema: &str,
    scale: &Scale,
    table: &mut Table,
) -> BenchResult<()> {
    let db = args.database_url.as_str();
    let subscribers = scale.small_fanout;
    let mut baseline: Option<FanoutFigures> = None;
    for (label, tls, streams) in [
        ("HTTP/1.1", false, None),
        ("HTTPS, HTTP/1.1", true, None),
        ("HTTPS, HTTP/2, 1 stream per connection", true, Some(1)),
        ("HTTPS, HTTP/2, 10 streams per connection", true, Some(10)),
    ] {
        let mut settings = RelaySettings::new(db, schema);
        if tls {
            settings = settings.with_tls(&args.work_dir)?;
        }
        let relay = start_relay(args, settings).await?;
        let server = if tls {
            Server::EventrelayTls {
                address: relay.address(),
                pids: vec![relay.pid()],
                http2_streams_per_connection: streams,
            }
        } else {
            relay_server(&relay)
        };
        eprintln!("fan-out {subscribers}, 100 ev/s, {label}");
        let plan = FanoutPlan {
            subscribers,
            scopes: 1,
            scope_prefix: format!("proto-{tls}-{streams:?}"),
            pace: Pace::PerSecond(100.0),
            duration: scale.fixed_run,
            writers: 4,
            source: emit_source(db, schema),
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
                    "deliveries/s {:.2}× · p50 {} vs {} · p99 {} vs {} · CPU s/1k {:.3} vs {:.3} · RSS {} vs {}",
                    f.deliveries_per_second / h1.deliveries_per_second.max(1.0),
                    ms(f.latency.p50),
                    ms(h1.latency.p50),
                    ms(f.latency.p99),
                    ms(h1.latency.p99),
                    f.cpu_seconds_per_1000,
                    h1.cpu_seconds_per_1000,
                    size(f.rss_bytes as f64),
                    size(h1.rss_bytes as f64)
                ),
                "–".to_owned(),
            ),
        }
    }
    Ok(())
}

fn fanout_target(subscribers: usize, pace: Pace, http: bool, f: &FanoutFigures) -> String {
    let all = f.delivered == f.expected;
    match pace {
        Pace::PerSecond(rate) if subscribers == 1_000 && rate == 100.0 && !http => format!(
            "p50 ≤ 3 ms, p99 ≤ 20 ms: {}",
            verdict(
                all && f.latency.p50 <= Duration::from_millis(3)
                    && f.latency.p99 <= Duration::from_millis(20)
            )
        ),
        _ if subscribers == 10_000 && !http => {
            format!(
                "10,000 subscribers on 2 cores, all received: {}",
                verdict(all)
            )
        }
        _ => format!("all received: {}", verdict(all)),
    }
}

/// Each pool varied on its own, for `docs/src/operations.md`.
async fn pool_rows(args: &Args, schema: &str, scale: &Scale, table: &mut Table) -> BenchResult<()> {
    let db = args.database_url.as_str();
    // Hub arbiters: many busy scopes.
    let rate = 1_000.0;
    for arbiters in [1, 2, 4] {
        let mut settings = RelaySettings::new(db, schema);
        settings.arbiters = arbiters;
        let relay = start_relay(args, settings).await?;
        eprintln!("pools: hub.arbiters = {arbiters}");
        let plan = FanoutPlan {
            subscribers: scale.scopes * scale.per_scope,
            scopes: scale.scopes,
            scope_prefix: format!("arbiters-{arbiters}"),
            pace: Pace::PerSecond(rate),
            duration: scale.fixed_run,
            writers: 4,
            source: emit_source(db, schema),
        };
        let before = pools::arbiter_busy(&relay, arbiters).await;
        let started = std::time::Instant::now();
        let f = fanout::run(&plan, &relay_server(&relay)).await?;
        let busiest =
            pools::busiest_arbiter(&relay, arbiters, &before, started.elapsed().as_secs_f64())
                .await;
        table.add(
            format!(
                "hub.arbiters = {arbiters}: {} scopes × {} subscribers, {rate:.0} ev/s, emit",
                scale.scopes, scale.per_scope
            ),
            format!(
                "busiest arbiter {:.0}% busy · {}",
                busiest * 100.0,
                fanout_summary(&f)
            ),
            format!("all received: {}", verdict(f.delivered == f.expected)),
        );
    }
    // Webhook workers: a receiver that takes 50 ms per request.
    let delay = Duration::from_millis(50);
    for workers in [1, 4, 16] {
        let receiver = WebhookReceiver::start_slow(delay).await?;
        let mut settings = RelaySettings::new(db, schema);
        settings.webhook_url = Some(receiver.url.clone());
        settings.webhook_workers = workers;
        let relay = start_relay(args, settings).await?;
        eprintln!("pools: webhooks.workers = {workers}");
        let events = (workers * 40).min(scale.webhook_events);
        let f = webhooks::run(&receiver, 1, db, schema, events).await?;
        let backlog_age = relay.metric("webhook_oldest_due_age_seconds").await;
        table.add(
            format!("webhooks.workers = {workers}: receiver answers in 50 ms, {events} deliveries"),
            format!(
                "{:.0} deliveries/s ({:.1} per worker) · {} of {} delivered · oldest due at the end {backlog_age:.1} s",
                f.deliveries_per_second,
                f.deliveries_per_second / workers as f64,
                f.delivered,
                f.events
            ),
            format!("all delivered: {}", verdict(f.delivered == f.events as u64)),
        );
        drop(relay);
    }
    // Database pool: a replay storm from the outbox.
    let subscribers = scale.small_fanout / 2;
    for pool_size in [2, 8, 32] {
        let mut settings = RelaySettings::new(db, schema);
        settings.pool_size = pool_size;
        let relay = start_relay(args, settings).await?;
        eprintln!("pools: database.pool_size = {pool_size}");
        let f = pools::replay_storm(
            &relay,
            db,
            schema,
            &format!("storm-{pool_size}"),
            subscribers,
            500,
        )
        .await?;
        table.add(
            format!(
                "database.pool_size = {pool_size}: {} subscribers replay {} events each from the outbox at once",
                f.subscribers, f.events
            ),
            format!(
                "all live after {:.2} s · mean pool wait {:.1} ms · {} events replayed",
                f.took.as_secs_f64(),
                f.mean_pool_wait.as_secs_f64() * 1000.0,
                f.received
            ),
            format!(
                "all replayed: {}",
                verdict(f.received == (f.subscribers * f.events) as u64)
            ),
        );
    }
    Ok(())
}

fn fanout_summary(f: &FanoutFigures) -> String {
    format!(
        "{:.0} deliveries/s · {} of {} received from {} events · p50 {} · p99 {} · max {} · {:.3} CPU s per 1,000 deliveries · RSS {}",
        f.deliveries_per_second,
        f.delivered,
        f.expected,
        f.published,
        ms(f.latency.p50),
        ms(f.latency.p99),
        ms(f.latency.max),
        f.cpu_seconds_per_1000,
        size(f.rss_bytes as f64)
    )
}

fn tails_budget_row(table: &mut Table, scopes: usize) {
    let budget = 64 * 1024 * 1024;
    let f = tails_budget::measure(scopes, budget);
    table.add(
        format!(
            "tail budget: {} active scopes × {} events of {} into 4 MiB tails, hub.tails_max_bytes {}",
            f.scopes,
            tails_budget::EVENTS_PER_SCOPE,
            size(tails_budget::EVENT_BYTES as f64),
            size(f.budget_bytes as f64)
        ),
        format!(
            "{} without a budget · {} held at the end, {} at most after any round · {} heap · {} tails emptied · {:.1} s",
            size(f.unbounded_bytes as f64),
            size(f.held_bytes as f64),
            size(f.peak_bytes as f64),
            size(f.heap_bytes as f64),
            f.tails_shrunk,
            f.seconds
        ),
        format!("≤ budget: {}", verdict(f.peak_bytes <= f.budget_bytes)),
    );
}

fn tail_rows(table: &mut Table) {
    for (label, bytes) in [
        ("300 B", 300),
        ("4 KiB", 4096),
        ("64 KiB", 65_536),
        ("1 MiB", 1_048_576),
    ] {
        let f = tail_memory::measure(bytes);
        let target = if bytes == 300 {
            format!("≤ 64 KiB: {}", verdict(f.heap_bytes <= 64 * 1024))
        } else {
            "–".to_owned()
        };
        table.add(
            format!(
                "tail memory: {} events of {label} (encoded), bound {} events / {}",
                tail_memory::EVENT_COUNT,
                tail_memory::BOUND_EVENTS,
                size(tail_memory::BOUND_BYTES as f64)
            ),
            format!(
                "{} events held · {} counted against the bound · {} heap really held",
                f.events_held,
                size(f.encoded_bytes as f64),
                size(f.heap_bytes as f64)
            ),
            target,
        );
    }
}

/// The two wake-up modes side by side on one server with `wal_level =
/// logical`: what emitting costs a writer at 1, 8 and 32 writers (a plain
/// write; the outbox row with no wake-up at all, the floor; notify mode
/// and logical mode, each with its relay running), then commit-to-receive
/// latency and relay CPU with both modes' relays running at once, for one
/// subscriber and for 1,000 subscribers × 100 ev/s.
async fn wakeup_rows(
    args: &Args,
    scale: &Scale,
    table: &mut Table,
    emit_cost: bool,
) -> BenchResult<()> {
    let Some(db) = args.logical_database_url.as_deref() else {
        eprintln!("wake-up modes: no --logical-database-url, skipped");
        return Ok(());
    };
    let notify_schema = format!("wake_notify_{}", std::process::id());
    let logical_schema = format!("wake_logical_{}", std::process::id());
    create_schema_for(db, &notify_schema, WakeupMode::Notify).await?;
    create_schema_for(db, &logical_schema, WakeupMode::Logical).await?;
    let schemas = [notify_schema.as_str(), logical_schema.as_str()];
    let mut outcome = Ok(());
    if emit_cost {
        outcome = wakeup_emit_cost(args, scale, table, db, schemas).await;
    }
    if outcome.is_ok() {
        outcome = wakeup_latency(args, scale, table, db, schemas).await;
    }
    drop_schema(db, &notify_schema).await;
    drop_schema(db, &logical_schema).await;
    outcome
}

/// What emitting costs a writer in each mode, against the floor.
async fn wakeup_emit_cost(
    args: &Args,
    scale: &Scale,
    table: &mut Table,
    db: &str,
    [notify_schema, logical_schema]: [&str; 2],
) -> BenchResult<()> {
    const WRITERS: [usize; 3] = [1, 8, 32];
    // Rounds of floor, notify and logical back to back, each figure the
    // median of its rounds: the machine and the tables drift over a run,
    // and a ratio of two figures taken minutes apart measures the drift too.
    // Every other round runs the three in reverse, so no case always comes
    // last, on the largest tables.
    const ROUNDS: usize = 5;
    emit_cost::prepare(db, notify_schema).await?;
    emit_cost::prepare(db, logical_schema).await?;
    let mut plain = Vec::new();
    for writers in WRITERS {
        eprintln!("wake-up modes: plain, {writers} writers");
        plain.push(
            emit_cost::measure(db, notify_schema, WriteKind::Plain, writers, scale.emit_run)
                .await?,
        );
    }
    // Per case (the floor, then each mode), per writer count, a figure
    // per round.
    let mut rounds = vec![vec![Vec::new(); WRITERS.len()]; 3];
    for round in 1..=ROUNDS {
        // (case, mode, schema); the floor is the logical schema with no
        // relay, so its trigger sends nothing and nothing decodes.
        let mut order = [
            (0, None, logical_schema),
            (1, Some(WakeupMode::Notify), notify_schema),
            (2, Some(WakeupMode::Logical), logical_schema),
        ];
        if round % 2 == 0 {
            order.reverse();
        }
        for (case, mode, schema) in order {
            let mut relay = match mode {
                None => None,
                Some(mode) => {
                    let mut settings = RelaySettings::new(db, schema);
                    settings.wakeup = mode.as_str();
                    Some(start_relay(args, settings).await?)
                }
            };
            let label = mode.map_or("floor".to_owned(), |mode| mode.to_string());
            for (index, writers) in WRITERS.into_iter().enumerate() {
                let tps =
                    emit_cost::measure(db, schema, WriteKind::WithSqlEmit, writers, scale.emit_run)
                        .await?;
                eprintln!(
                    "wake-up modes: round {round}, {label}, {writers} writers: {tps:.0} tx/s"
                );
                rounds[case][index].push(tps);
            }
            if let Some(relay) = relay.as_mut() {
                relay.terminate(Duration::from_secs(10)).await?;
            }
        }
    }
    let (floor_rounds, mode_rounds) = (&rounds[0], [&rounds[1], &rounds[2]]);
    let floor: Vec<f64> = floor_rounds.iter().map(|r| median(r)).collect();
    let emits = |slot: usize| -> Vec<f64> { mode_rounds[slot].iter().map(|r| median(r)).collect() };
    let (notify, logical) = (emits(0), emits(1));
    for (index, writers) in WRITERS.into_iter().enumerate() {
        let of_floor = |tps: f64| tps / floor[index];
        let ratio = of_floor(logical[index]);
        let target = if writers == 1 {
            "–".to_owned()
        } else {
            format!("logical ≥ 0.85× the floor: {}", verdict(ratio >= 0.85))
        };
        table.add(
            format!("emit cost by wake-up mode, {writers} writer(s)"),
            format!(
                "plain {:.0} tx/s · outbox row, no wake-up (floor) {:.0} · notify {:.0} ({:.2}× floor) · logical {:.0} ({ratio:.2}× floor) · medians of {ROUNDS} rounds",
                plain[index],
                floor[index],
                notify[index],
                of_floor(notify[index]),
                logical[index],
            ),
            target,
        );
    }
    Ok(())
}

/// Commit-to-receive in both modes at once: a relay per mode, each with its
/// subscribers, and events going to one mode, then the other, in slices of
/// half a second (A B, B A, …). Rounds of a relay each, minutes apart, let
/// the machine's drift decide which mode looked faster; slices this short
/// give both modes the same minutes. First with one subscriber per mode,
/// which times the wake-up itself, then with the full fan-out.
async fn wakeup_latency(
    args: &Args,
    scale: &Scale,
    table: &mut Table,
    db: &str,
    schemas: [&str; 2],
) -> BenchResult<()> {
    let mut relays = Vec::new();
    for (mode, schema) in WAKEUP_MODES.into_iter().zip(schemas) {
        let mut settings = RelaySettings::new(db, schema);
        settings.wakeup = mode.as_str();
        relays.push(start_relay(args, settings).await?);
    }
    let servers: Vec<Server> = relays.iter().map(relay_server).collect();
    let mut outcome = Ok(());
    // The fan-out as long as three rounds of each mode would take.
    for (subscribers, duration) in [
        (1, scale.fixed_run * 2),
        (scale.small_fanout, scale.fixed_run * 6),
    ] {
        outcome = wakeup_pair_row(table, db, schemas, &servers, subscribers, duration).await;
        if outcome.is_err() {
            break;
        }
    }
    for relay in &mut relays {
        relay.terminate(Duration::from_secs(10)).await?;
    }
    outcome
}

const WAKEUP_MODES: [WakeupMode; 2] = [WakeupMode::Notify, WakeupMode::Logical];

/// One paired run of the wake-up modes' relays, as rows of the table.
async fn wakeup_pair_row(
    table: &mut Table,
    db: &str,
    schemas: [&str; 2],
    servers: &[Server],
    subscribers: usize,
    duration: Duration,
) -> BenchResult<()> {
    const PER_SECOND: f64 = 100.0;
    eprintln!(
        "wake-up modes: {subscribers} subscriber(s) per mode, both relays running, events alternating between them for {duration:?}"
    );
    let plan = PairedPlan {
        subscribers,
        scope_prefix: format!("wake-{}-{subscribers}", std::process::id()),
        per_second: PER_SECOND,
        slice: (PER_SECOND / 2.0) as usize,
        duration,
        writers: 4,
        sources: schemas.map(|schema| emit_source(db, schema)),
    };
    let figures = paired_fanout::run(&plan, [&servers[0], &servers[1]]).await?;
    let [notify, logical] = &figures.sides;
    for (mode, side) in WAKEUP_MODES.into_iter().zip(&figures.sides) {
        let target = match mode {
            WakeupMode::Notify => "–".to_owned(),
            WakeupMode::Logical => format!(
                "p50 ≤ notify's: {:.3} against {:.3} ms {}",
                logical.latency.p50.as_secs_f64() * 1000.0,
                notify.latency.p50.as_secs_f64() * 1000.0,
                verdict(logical.latency.p50 <= notify.latency.p50)
            ),
        };
        table.add(
            format!(
                "wake-up {mode}: {subscribers} sub(s), 1 scope, {PER_SECOND} ev/s, SQL emit (commit-to-receive), \
                 both modes in one run, alternating every {} events",
                plan.slice
            ),
            format!(
                "p50 {} · p99 {} · max {} · {} of {} received from {} events · {:.3} relay CPU s per 1,000 deliveries",
                ms(side.latency.p50),
                ms(side.latency.p99),
                ms(side.latency.max),
                side.delivered,
                side.expected,
                side.published,
                side.cpu_seconds_per_1000,
            ),
            target,
        );
    }
    table.add(
        format!("wake-up modes, {subscribers} sub(s): slice pairs (one slice of each mode, back to back)"),
        format!(
            "logical's p50 ≤ notify's in {} of {} pairs · median difference (logical − notify) {:+.2} ms",
            figures.second_not_slower, figures.pairs, figures.median_difference_ms
        ),
        "–",
    );
    Ok(())
}

/// The loopback addresses streams connect from, so that tens of thousands
/// of them stay within each source's ephemeral port range.
fn stream_sources() -> Vec<std::net::IpAddr> {
    (2..=9)
        .map(|last| std::net::IpAddr::from([127, 0, 0, last]))
        .collect()
}

/// Idle streams on one relay in steps up to 19,000 (under the machine's
/// 20,000 open files), then one event per second into each of 10 scopes.
async fn streams_rows(args: &Args, schema: &str, table: &mut Table) -> BenchResult<()> {
    let db = args.database_url.as_str();
    let (steps, settle, duration) = if args.quick {
        (
            vec![500, 1_000, 1_900],
            Duration::from_secs(1),
            Duration::from_secs(5),
        )
    } else {
        (
            vec![5_000, 10_000, 19_000],
            Duration::from_secs(5),
            Duration::from_secs(30),
        )
    };
    let total = steps.last().copied().unwrap_or(0);
    let relay = start_relay(args, RelaySettings::new(db, schema)).await?;
    let plan = streams::StreamsPlan {
        steps,
        settle,
        scopes: 10,
        scope_prefix: "streams".to_owned(),
        rate_per_scope: 1.0,
        duration,
        per_child: 9_500,
        sources: stream_sources(),
        // Nothing restarts here: a stream that ended would be a failure.
        reconnect_delay: Duration::from_millis(50),
    };
    eprintln!("streams: {total} on one relay");
    let bench_bin = std::env::current_exe()?;
    let f = streams::run(
        &plan,
        &mut [relay],
        None,
        &bench_bin,
        &args.work_dir,
        &emit_source(db, schema),
    )
    .await?;
    let per = |streams: usize| {
        f.steps
            .iter()
            .find(|step| step.streams == streams)
            .map_or(0.0, |step| step.rss_per_stream)
    };
    let readings: Vec<String> = f
        .steps
        .iter()
        .map(|step| format!("{} at {}", size(step.rss_per_stream), step.streams))
        .collect();
    let middle = f
        .steps
        .get(f.steps.len().saturating_sub(2))
        .map_or(0, |s| s.streams);
    let (at_middle, at_total) = (per(middle), per(total));
    let flat = at_total <= at_middle * 1.1;
    table.add(
        format!(
            "streams: RSS per idle stream, one relay, {} s after each step",
            settle.as_secs()
        ),
        readings.join(" · "),
        format!(
            "≤ 14 KiB at {middle}: {} · {total} within 10% of {middle}: {}",
            verdict(at_middle <= 14.0 * 1024.0),
            verdict(flat)
        ),
    );
    table.add(
        format!("streams: connect {total} (raw HTTP/1.1, 8 source addresses)"),
        format!(
            "{:.0} streams/s ({total} in {:.1} s of connecting, {} client processes × 200 handshakes in flight)",
            f.connect_rate(),
            f.connect_time.as_secs_f64(),
            f.children
        ),
        "–",
    );
    let all = f.missing == 0 && f.unexpected == 0 && f.delivered == f.expected && f.expected > 0;
    table.add(
        format!(
            "streams: {total} streams, 1 ev/s into each of 10 scopes for {} s, emit (commit-to-receive)",
            duration.as_secs()
        ),
        format!(
            "{:.0} deliveries/s · p50 {} · p99 {} · max {} · delivered {} of {} ({} missing in {} streams, {} unexpected, {} repeated) · relay CPU {:.3} s per 1,000 deliveries · relay RSS {}",
            f.deliveries_per_second,
            ms(f.latency.p50),
            ms(f.latency.p99),
            ms(f.latency.max),
            f.delivered,
            f.expected,
            f.missing,
            f.streams_short,
            f.unexpected,
            f.repeated,
            f.cpu_seconds_per_1000,
            size(f.rss_after.iter().sum::<u64>() as f64)
        ),
        if all {
            format!("every delivery made: {}", verdict(true))
        } else {
            format!("every delivery made: {} (deliveries missing)", verdict(false))
        },
    );
    Ok(())
}

/// Relays of the box scenario, and each one's pool: 6 × (6 pooled + 1
/// LISTEN) = 42 of Postgres's 100 default `max_connections`, leaving room
/// for the emitters and anything else on the server.
const BOX_RELAYS: usize = 6;
const BOX_POOL_SIZE: usize = 6;

/// 100,000 streams over six relays on one database, one event per second
/// into each of 10 scopes, then every relay restarted at once under them.
async fn streams_box_rows(args: &Args, schema: &str, table: &mut Table) -> BenchResult<()> {
    let db = args.database_url.as_str();
    let (steps, settle, duration) = if args.quick {
        (
            vec![3_000, 6_000],
            Duration::from_secs(1),
            Duration::from_secs(5),
        )
    } else {
        (
            vec![50_000, 100_000],
            Duration::from_secs(5),
            Duration::from_secs(30),
        )
    };
    let total = steps.last().copied().unwrap_or(0);
    let mut settings = RelaySettings::new(db, schema);
    settings.pool_size = BOX_POOL_SIZE;
    settings.header_timeout_secs = std::env::var("BOX_HEADER_TIMEOUT_SECS")
        .ok()
        .and_then(|secs| secs.parse().ok());
    let all_settings = vec![settings; BOX_RELAYS];
    let mut relays = Vec::with_capacity(BOX_RELAYS);
    for settings in &all_settings {
        relays.push(start_relay(args, settings.clone()).await?);
    }
    let plan = streams::StreamsPlan {
        steps,
        settle,
        scopes: 10,
        scope_prefix: "box".to_owned(),
        rate_per_scope: 1.0,
        duration,
        per_child: 9_500,
        sources: stream_sources(),
        // As an EventSource does: the relay's `retry:` of 3 s.
        reconnect_delay: Duration::from_secs(3),
    };
    eprintln!("streams-box: {total} over {BOX_RELAYS} relays");
    let bench_bin = std::env::current_exe()?;
    let restart = streams::Restart {
        binary: &args.relay_bin,
        settings: &all_settings,
    };
    let f = streams::run(
        &plan,
        &mut relays,
        Some(restart),
        &bench_bin,
        &args.work_dir,
        &emit_source(db, schema),
    )
    .await?;
    for step in &f.steps {
        let per_relay: Vec<String> = step.per_relay.iter().map(|per| size(*per)).collect();
        table.add(
            format!(
                "streams-box: RSS per idle stream at {}, {BOX_RELAYS} relays (pool {BOX_POOL_SIZE} each), {} s idle",
                step.streams,
                settle.as_secs()
            ),
            format!(
                "{} over all relays · per relay {}",
                size(step.rss_per_stream),
                per_relay.join(" / ")
            ),
            "–",
        );
    }
    table.add(
        format!("streams-box: connect {total} over {BOX_RELAYS} relays"),
        format!(
            "{:.0} streams/s ({total} in {:.1} s of connecting, {} client processes × 200 handshakes in flight, 8 source addresses)",
            f.connect_rate(),
            f.connect_time.as_secs_f64(),
            f.children
        ),
        "–",
    );
    let span_share = |delivered: u64| {
        if f.delivered == 0 {
            0.0
        } else {
            f.deliveries_per_second * delivered as f64 / f.delivered as f64
        }
    };
    let per_relay: Vec<String> = f
        .delivered_per_relay
        .iter()
        .map(|delivered| format!("{:.0}", span_share(*delivered)))
        .collect();
    let all = f.missing == 0 && f.unexpected == 0 && f.delivered == f.expected && f.expected > 0;
    table.add(
        format!(
            "streams-box: {total} streams, 1 ev/s into each of 10 scopes for {} s, emit (commit-to-receive)",
            duration.as_secs()
        ),
        format!(
            "{:.0} deliveries/s (per relay {}) · p50 {} · p99 {} · max {} · delivered {} of {} ({} missing in {} streams, {} unexpected) · relays' CPU {:.3} s per 1,000 deliveries · relays' RSS {}",
            f.deliveries_per_second,
            per_relay.join(" / "),
            ms(f.latency.p50),
            ms(f.latency.p99),
            ms(f.latency.max),
            f.delivered,
            f.expected,
            f.missing,
            f.streams_short,
            f.unexpected,
            f.cpu_seconds_per_1000,
            size(f.rss_after.iter().sum::<u64>() as f64)
        ),
        format!("every delivery made: {}", verdict(all)),
    );
    if let Some(storm) = &f.storm {
        let clean = storm.refused == 0 && storm.broken == 0 && storm.all_streaming_after.is_some();
        table.add(
            format!("streams-box: every relay restarted at once under {total} streams (SIGTERM, a new process on the same port; clients resume with Last-Event-ID)"),
            format!(
                "relays back after {:.1} s · all {total} streaming again after {} · {} refused (408: {}, 429: {}, 5xx: {}), {} broken · clients reconnect after the relay's retry: of 3 s",
                storm.relays_back_after.as_secs_f64(),
                storm
                    .all_streaming_after
                    .map_or("never (within 180 s)".to_owned(), |after| format!("{:.1} s", after.as_secs_f64())),
                storm.refused,
                storm.refused_408,
                storm.refused_429,
                storm.refused_5xx,
                storm.broken
            ),
            format!("0 errors: {}", verdict(clean)),
        );
    }
    Ok(())
}

fn emit_source(db: &str, schema: &str) -> Source {
    Source::Emit {
        database_url: db.to_owned(),
        schema: schema.to_owned(),
    }
}

fn relay_server(relay: &RelayProcess) -> Server {
    Server::Eventrelay {
        address: relay.address(),
        pids: vec![relay.pid()],
    }
}

/// The HTTP publish API with group commit off and on, for 1 and 64
/// concurrent publishers, and batch emit against one emit per event.
async fn publish_rows(
    args: &Args,
    schema: &str,
    scale: &Scale,
    table: &mut Table,
) -> BenchResult<()> {
    let db = args.database_url.as_str();
    let baseline_at_64 = match &args.baseline_relay_bin {
        Some(binary) => Some(baseline_publish_row(args, binary, scale, table).await?),
        None => None,
    };
    let mut off_at_64 = None;
    for group_commit_ms in [0, 2] {
        let mut settings = RelaySettings::new(db, schema);
        settings.group_commit_ms = group_commit_ms;
        let relay = start_relay(args, settings).await?;
        let label = if group_commit_ms == 0 {
            "group commit off".to_owned()
        } else {
            format!("group commit on ({group_commit_ms} ms)")
        };
        for publishers in [1, 64] {
            eprintln!("HTTP publish, {publishers} publishers, {label}");
            let f =
                publish_throughput::http_publish(relay.address(), publishers, scale.emit_run * 2)
                    .await?;
            let target = match (group_commit_ms, publishers) {
                (0, 64) => {
                    off_at_64 = Some(f.events_per_second);
                    "–".to_owned()
                }
                (_, 64) => {
                    let off = f.events_per_second / off_at_64.unwrap_or(f64::INFINITY);
                    let mut target = format!("{off:.1}× group commit off");
                    if let Some(baseline) = baseline_at_64 {
                        // One pair of runs, half a minute apart; the
                        // alternating rounds below judge the target.
                        let ratio = f.events_per_second / baseline;
                        target = format!("{ratio:.1}× the earlier release ({target})");
                    }
                    target
                }
                _ => "–".to_owned(),
            };
            table.add(
                format!("HTTP publish, durable, {publishers} concurrent publisher(s), {label}"),
                publish_figures(&f),
                target,
            );
        }
    }
    if let Some(binary) = &args.baseline_relay_bin {
        alternating_publish_rounds(args, binary, schema, scale, table).await?;
    }
    let count = if args.quick { 1_000 } else { 5_000 };
    let (one_by_one, batched) = publish_throughput::emit_versus_batch(db, schema, count).await?;
    table.add(
        format!("publisher: {count} durable events in one transaction, emit each vs emit_batch"),
        format!(
            "emit: {one_by_one:.0} events/s · emit_batch: {batched:.0} events/s ({:.1}×)",
            batched / one_by_one
        ),
        "–".to_owned(),
    );
    Ok(())
}

/// Reconnect storms: the large fan-out's subscriber count riding out a
/// SIGTERM restart, then two more waves, each arriving while the previous
/// one hangs up.
async fn storm_rows(
    args: &Args,
    schema: &str,
    scale: &Scale,
    table: &mut Table,
) -> BenchResult<()> {
    let n = scale.large_fanout;
    eprintln!("reconnect storm: {n} subscribers");
    let plan = StormPlan {
        subscribers: n,
        scopes: 100,
        events_per_sec: 20.0,
        emitting: scale.fixed_run,
        extra_waves: 2,
    };
    let settings = RelaySettings::new(&args.database_url, schema);
    let f = storm::run(&plan, &args.relay_bin, &args.work_dir, &settings).await?;
    let phase = |p: &storm::PhaseFigures| {
        format!(
            "{} · connect p50 {} · p99 {} · 408: {} · 5xx: {} · other refusals: {} · resets: {}{}",
            p.all_streaming_after.map_or_else(
                || format!("not all {n} streaming"),
                |d| format!("all {n} streaming after {:.2} s", d.as_secs_f64())
            ),
            ms(p.connect.p50),
            ms(p.connect.p99),
            p.timeouts,
            p.server_errors,
            p.other_refusals,
            p.resets,
            if p.reset_reasons.is_empty() {
                String::new()
            } else {
                format!(" ({:?})", p.reset_reasons)
            }
        )
    };
    table.add(
        format!("reconnect storm: {n} subscribers connect at once (100 scopes)"),
        phase(&f.first),
        format!("no 408, 5xx or reset: {}", verdict(f.first.clean())),
    );
    table.add(
        format!(
            "reconnect storm: SIGTERM and restart under {n} subscribers, 20 ev/s emitted throughout"
        ),
        format!(
            "old process exited {:.2} s after SIGTERM · from the new process's start, {} · {} events, {} missed",
            f.stopped_in.as_secs_f64(),
            phase(&f.restart),
            f.emitted,
            f.missed
        ),
        format!(
            "all back, no 408, 5xx or reset, none missed: {}",
            verdict(f.restart.clean() && f.missed == 0)
        ),
    );
    for (index, wave) in f.waves.iter().enumerate() {
        table.add(
            format!(
                "reconnect storm: wave {} of {n} arrives while wave {} hangs up",
                index + 2,
                index + 1
            ),
            phase(wave),
            format!("no 408, 5xx or reset: {}", verdict(wave.clean())),
        );
    }
    let first = f.rss_streaming_kib.first().copied().unwrap_or(0) as f64;
    let last = f.rss_streaming_kib.last().copied().unwrap_or(0) as f64;
    table.add(
        format!("reconnect storm: relay RSS with each wave of {n} streaming"),
        format!(
            "before: {} · {} · after the last wave left: {} · 5 s later: {}",
            size(f.rss_before_kib as f64 * 1024.0),
            f.rss_streaming_kib
                .iter()
                .map(|kib| size(*kib as f64 * 1024.0))
                .collect::<Vec<_>>()
                .join(" → "),
            size(f.rss_after_kib as f64 * 1024.0),
            size(f.rss_settled_kib as f64 * 1024.0)
        ),
        format!(
            "last wave within 10% of the first: {}",
            verdict(last <= first * 1.10)
        ),
    );
    Ok(())
}

/// How a publish row reads.
fn publish_figures(f: &publish_throughput::PublishFigures) -> String {
    format!(
        "{:.0} events/s · publish latency p50 {} · p99 {} · {} failed",
        f.events_per_second,
        ms(f.latency.p50),
        ms(f.latency.p99),
        f.failed
    )
}

/// The 1- and 64-publisher HTTP publish rows against an earlier release,
/// on a schema of its own that it migrates itself; answers its events/s
/// at 64 publishers.
async fn baseline_publish_row(
    args: &Args,
    binary: &std::path::Path,
    scale: &Scale,
    table: &mut Table,
) -> BenchResult<f64> {
    // A schema of its own, which it migrates at start with its own
    // migrations.
    let schema = eventrelay_bench::database::unique_schema("bench_baseline");
    let mut settings = RelaySettings::new(&args.database_url, &schema);
    settings.baseline = true;
    let rows = baseline_rows(args, binary, &settings, scale, table).await;
    drop_schema(&args.database_url, &schema).await;
    rows
}

/// How many paired rounds compare the earlier release with this one.
const PUBLISH_ROUNDS: usize = 3;

/// 64 publishers against the earlier release and against this one (group
/// commit on), both relays running, in [`PUBLISH_ROUNDS`] rounds whose
/// order alternates: this machine's speed drifts within minutes, so one
/// pair of runs taken half a minute apart can be off by a third either
/// way. The target is judged on the median of the rounds' ratios.
async fn alternating_publish_rounds(
    args: &Args,
    binary: &std::path::Path,
    schema: &str,
    scale: &Scale,
    table: &mut Table,
) -> BenchResult<()> {
    let baseline_schema = eventrelay_bench::database::unique_schema("bench_baseline");
    let mut baseline_settings = RelaySettings::new(&args.database_url, &baseline_schema);
    baseline_settings.baseline = true;
    let rounds = async {
        let baseline = RelayProcess::start(binary, &args.work_dir, &baseline_settings).await?;
        let mut settings = RelaySettings::new(&args.database_url, schema);
        settings.group_commit_ms = 2;
        let current = start_relay(args, settings).await?;
        let mut shown = Vec::new();
        let mut ratios = Vec::new();
        for round in 0..PUBLISH_ROUNDS {
            eprintln!(
                "HTTP publish, 64 publishers, round {} of {PUBLISH_ROUNDS}",
                round + 1
            );
            let order = if round % 2 == 0 {
                [baseline.address(), current.address()]
            } else {
                [current.address(), baseline.address()]
            };
            let mut figures = Vec::new();
            for address in order {
                figures
                    .push(publish_throughput::http_publish(address, 64, scale.emit_run * 2).await?);
            }
            if round % 2 == 1 {
                figures.reverse();
            }
            let (earlier, now) = (&figures[0], &figures[1]);
            let ratio = now.events_per_second / earlier.events_per_second;
            shown.push(format!(
                "{:.0} vs {:.0} events/s, p99 {} vs {} ({ratio:.1}×)",
                earlier.events_per_second,
                now.events_per_second,
                ms(earlier.latency.p99),
                ms(now.latency.p99),
            ));
            ratios.push(ratio);
        }
        BenchResult::Ok((shown, ratios))
    }
    .await;
    drop_schema(&args.database_url, &baseline_schema).await;
    let (shown, ratios) = rounds?;
    let ratio = median(&ratios);
    table.add(
        format!(
            "HTTP publish, durable, 64 concurrent publishers, earlier release vs group commit on, \
             {PUBLISH_ROUNDS} rounds in alternating order"
        ),
        format!("{} · median {ratio:.1}×", shown.join(" · ")),
        format!(
            "≥ 10× the earlier release: {ratio:.1}× {}",
            verdict(ratio >= 10.0)
        ),
    );
    Ok(())
}

async fn baseline_rows(
    args: &Args,
    binary: &std::path::Path,
    settings: &RelaySettings,
    scale: &Scale,
    table: &mut Table,
) -> BenchResult<f64> {
    let relay = RelayProcess::start(binary, &args.work_dir, settings).await?;
    let mut at_64 = 0.0;
    for publishers in [1, 64] {
        eprintln!("HTTP publish, {publishers} publishers, earlier release");
        let f = publish_throughput::http_publish(relay.address(), publishers, scale.emit_run * 2)
            .await?;
        if publishers == 64 {
            at_64 = f.events_per_second;
        }
        table.add(
            format!(
                "HTTP publish, durable, {publishers} concurrent publisher(s), earlier release ({})",
                binary.display()
            ),
            publish_figures(&f),
            "–".to_owned(),
        );
    }
    Ok(at_64)
}

/// A logical relay down for 60 s (10 s with `--quick`) while events
/// commit: what its absence holds on the primary.
async fn outage_row(args: &Args, table: &mut Table) -> BenchResult<()> {
    let Some(db) = args.logical_database_url.as_deref() else {
        eprintln!("outage: no --logical-database-url, skipped");
        return Ok(());
    };
    let length = Duration::from_secs(if args.quick { 10 } else { 60 });
    const PER_SECOND: f64 = 200.0;
    eprintln!("outage: a logical relay killed, {length:?} of commits");
    let f = outage::run(&args.relay_bin, &args.work_dir, db, length, PER_SECOND).await?;
    let most_slots = f.samples.iter().map(|s| s.slots).max().unwrap_or(0);
    let most_held = f.samples.iter().map(|s| s.held_bytes).max().unwrap_or(0);
    let wal_dir: Vec<String> = f
        .samples
        .iter()
        .map(|s| size(s.wal_dir_bytes as f64))
        .collect();
    table.add(
        format!(
            "logical relay killed (SIGKILL), {}s outage, {PER_SECOND} commits/s, sampled every {}s",
            length.as_secs(),
            length.as_secs() / 6
        ),
        format!(
            "slots while streaming {} · slots during the outage at most {most_slots} · WAL held by slots at most {} · {} committed, {} of WAL written · pg_wal {}",
            f.slots_before,
            size(most_held as f64),
            f.committed,
            size(f.wal_written_bytes as f64),
            wal_dir.join(" → ")
        ),
        format!(
            "no slot and no WAL held while the relay is down: {}",
            verdict(most_slots == 0 && most_held == 0)
        ),
    );
    Ok(())
}

/// Relays decoding on the primary against relays decoding on its standby,
/// 1, 5 and 10 of them, alternating placements at each count.
async fn standby_rows(args: &Args, scale: &Scale, table: &mut Table) -> BenchResult<()> {
    let (Some(primary_url), Some(standby_url), Some(primary_data)) = (
        args.standby_primary_url.clone(),
        args.standby_url.clone(),
        args.standby_primary_data.clone(),
    ) else {
        eprintln!(
            "standby: no --standby-primary-url/--standby-url/--standby-primary-data, skipped"
        );
        return Ok(());
    };
    let pair = standby::Pair {
        primary_url,
        standby_url,
        primary_data,
    };
    const PER_SECOND: f64 = 200.0;
    for relays in [1, 5, 10] {
        let mut cpu = Vec::new();
        for placement in [standby::Placement::Primary, standby::Placement::Standby] {
            eprintln!(
                "standby: {relays} relay(s) decoding on the {}",
                placement.as_str()
            );
            let f = standby::run(&standby::Run {
                relay_bin: &args.relay_bin,
                work_dir: &args.work_dir,
                pair: &pair,
                relays,
                placement,
                per_second: PER_SECOND,
                duration: scale.fixed_run,
            })
            .await?;
            cpu.push(f.cpu_seconds_per_1000);
            table.add(
                format!(
                    "{relays} logical relay(s) decoding on the {}, {PER_SECOND} commits/s, emit (commit-to-receive, 1 subscriber)",
                    placement.as_str()
                ),
                format!(
                    "primary CPU {:.1} ms per 1,000 commits · p50 {} · p99 {} · max {} · {} of {} received",
                    f.cpu_seconds_per_1000 * 1000.0,
                    ms(f.latency.p50),
                    ms(f.latency.p99),
                    ms(f.latency.max),
                    f.delivered,
                    f.expected
                ),
                match placement {
                    standby::Placement::Primary => "–".to_owned(),
                    standby::Placement::Standby => format!(
                        "standby takes the decoding off the primary: {}",
                        verdict(cpu[1] < cpu[0])
                    ),
                },
            );
        }
    }
    Ok(())
}

async fn start_relay(args: &Args, settings: RelaySettings) -> BenchResult<RelayProcess> {
    RelayProcess::start(&args.relay_bin, &args.work_dir, &settings).await
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|line| line.starts_with("model name"))
                .and_then(|line| line.split_once(':'))
                .map(|(_, model)| model.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".to_owned())
}

/// What sealing the channel costs, side by side with an open channel and
/// with sealed pointers that carry no rows (see `seal_cost`).
async fn seal_rows(args: &Args, schema: &str, table: &mut Table) -> BenchResult<()> {
    const WRITERS: [usize; 2] = [1, 8];
    let (rounds, run_for, samples) = if args.quick {
        (2, Duration::from_secs(2), 200)
    } else {
        (3, Duration::from_secs(4), 1_000)
    };
    let figures = seal_cost::run(
        &args.database_url,
        schema,
        &WRITERS,
        rounds,
        run_for,
        samples,
    )
    .await?;
    let sealed = &figures[0].1;
    for (w, writers) in WRITERS.iter().enumerate() {
        let base = median(&sealed.tps[w]);
        let cells: Vec<String> = figures
            .iter()
            .map(|(variant, f)| {
                let tps = median(&f.tps[w]);
                format!("{} {tps:.0} tx/s ({:.2}×)", variant.name(), tps / base)
            })
            .collect();
        table.add(
            format!("sealing: SQL emit(), {writers} writer(s), medians of {rounds} rounds"),
            cells.join(" · "),
            "–",
        );
    }
    let cells: Vec<String> = figures
        .iter()
        .map(|(variant, f)| {
            let mut samples = f.latency_ns.clone();
            let p = eventrelay_bench::clock::Percentiles::of(&mut samples);
            format!("{} p50 {} · p99 {}", variant.name(), ms(p.p50), ms(p.p99))
        })
        .collect();
    table.add(
        format!(
            "sealing: emit+commit to rows in hand, 1 writer, {} events each",
            samples * rounds
        ),
        cells.join(" · "),
        "–",
    );
    table.add(
        "sealing: the relay opening one payload",
        format!(
            "{:.1} µs for a 300-byte pointer · {:.1} µs at the {}-byte limit",
            seal_cost::open_micros(300)?,
            seal_cost::open_micros(eventrelay_wire::MAX_NOTIFY_PAYLOAD_BYTES)?,
            eventrelay_wire::MAX_NOTIFY_PAYLOAD_BYTES
        ),
        "–",
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_load;

    #[test]
    fn a_floor_load_is_subscribers_times_a_rate() {
        assert_eq!(parse_load("1000x100"), Ok((1000, 100.0)));
        assert_eq!(parse_load("10000×2.5"), Ok((10000, 2.5)));
        for bad in [
            "1000", "x100", "1000x", "0x100", "1000x0", "1000x-1", "ax1", "1000xinf",
        ] {
            assert!(parse_load(bad).is_err(), "{bad} was taken as a load");
        }
    }
}
