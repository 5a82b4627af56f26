//! `eventrelay-bench`: runs the scenarios and prints one Markdown table.
//! `bench/run` builds it, starts Postgres and nginx/nchan, and calls it.

#![allow(
    clippy::print_stdout,
    reason = "the figures table is this tool's output"
)]

use clap::Parser;
use eventrelay_bench::alloc_counter::CountingAllocator;
use eventrelay_bench::context::{Args, Context, Run, Scale, Scenario};
use eventrelay_bench::database::{create_schema, drop_schema};
use eventrelay_bench::report::Table;
use eventrelay_bench::scenarios::*;
use eventrelay_bench::{BenchResult, rows, stream_client};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

const SCENARIOS: &[Scenario] = &[
    scenario("tail", Run::Alone(tail::rows)),
    scenario("emit", rows!(emit_cost::rows)),
    scenario("publish", rows!(publish_throughput::rows)),
    scenario("seal", rows!(seal_cost::rows)),
    scenario("wakeup", rows!(wakeup::rows)),
    scenario("fanout", rows!(fanout::rows)),
    scenario("floor", rows!(floor::rows)),
    scenario("memory", rows!(connection_heap::rows)),
    scenario("storm", rows!(streams::storm_rows)),
    scenario("streams", rows!(streams::rows)),
    scenario("webhooks", rows!(webhooks::rows)),
    scenario("presence", rows!(presence_cost::rows)),
    scenario("scopes", rows!(scope_cost::rows)),
    scenario("traces", rows!(trace_cost::rows)),
    // 100,000 streams over 6 relays: only when named.
    Scenario {
        name: "box",
        by_default: false,
        run: rows!(streams::box_rows),
    },
];

const fn scenario(name: &'static str, run: Run) -> Scenario {
    Scenario {
        name,
        by_default: true,
        run,
    }
}

fn main() -> BenchResult<()> {
    // The stream-holding client processes, started by the load tool itself.
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some(stream_client::SUBCOMMAND) {
        return stream_client::main(&argv[2..]);
    }
    let args = Args::parse();
    let known = |only: &&String| SCENARIOS.iter().any(|s| s.name == only.as_str());
    let unknown: Vec<&String> = args.only.iter().filter(|only| !known(only)).collect();
    if !unknown.is_empty() {
        return Err(format!("no scenario named {unknown:?}").into());
    }
    let cx = Context {
        scale: Scale::of(args.quick),
        schema: format!("bench_{}", std::process::id()),
        args,
    };
    let mut table = Table::default();
    // Before any runtime exists, so no other thread allocates meanwhile.
    for scenario in SCENARIOS.iter().filter(|s| s.wanted(&cx)) {
        if let Run::Alone(run) = scenario.run {
            run(&cx, &mut table);
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let result = runtime.block_on(async {
        std::fs::create_dir_all(&cx.args.work_dir)?;
        create_schema(cx.db(), &cx.schema).await?;
        let mut outcome = Ok(());
        for scenario in SCENARIOS.iter().filter(|s| s.wanted(&cx)) {
            if let Run::Async(run) = scenario.run {
                outcome = run(&cx, &mut table).await;
                if outcome.is_err() {
                    break;
                }
            }
        }
        drop_schema(cx.db(), &cx.schema).await;
        outcome
    });
    println!("\n{}", table.render());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!("machine: {cores} cores, {}", cpu_model());
    result
}

fn cpu_model() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let line = info.lines().find(|line| line.starts_with("model name"));
    let model = line.and_then(|line| Some(line.split_once(':')?.1.trim()));
    model.unwrap_or("unknown CPU").to_owned()
}
