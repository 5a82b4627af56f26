//! `eventrelay-campaign`: runs the fault campaign (the `eventrelay_campaign`
//! library) and prints its report; exits 1 when the checker found an
//! anomaly, 2 when the campaign could not run.
//!
//! ```sh
//! eventrelay-campaign --relay-bin target/release/eventrelay --seed 7 --duration 60 --mode notify
//! ```

#![allow(clippy::print_stdout, reason = "the report is this tool's output")]

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use eventrelay_campaign::{Plan, run};

#[derive(Parser, Debug)]
#[command(
    about = "Runs eventrelay under a seeded schedule of faults and checks what every client received"
)]
struct Args {
    /// The `eventrelay` binary the relays run.
    #[arg(long)]
    relay_bin: PathBuf,
    /// Draws the fault schedule (and the writers' and subscribers' choices).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Seconds of writing and faults, before the subscribers drain.
    #[arg(long, default_value_t = 60)]
    duration: u64,
    /// The relays' wake-up mode.
    #[arg(long, default_value = "notify", value_parser = ["notify", "logical"])]
    mode: String,
    #[arg(long, default_value_t = 2)]
    relays: usize,
    #[arg(long, default_value_t = 50)]
    scopes: usize,
    #[arg(long, default_value_t = 16)]
    subscribers: usize,
    /// Writers, the first of which holds each transaction open for seconds.
    #[arg(long, default_value_t = 4)]
    writers: usize,
    /// Seconds between faults, on average.
    #[arg(long, default_value_t = 3.0)]
    fault_every: f64,
    /// Where the cluster, the relays' configurations and logs go.
    #[arg(long, default_value = "/tmp/eventrelay-campaign")]
    work_dir: PathBuf,
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let plan = Plan {
        seed: args.seed,
        duration: Duration::from_secs(args.duration),
        wakeup: if args.mode == "logical" {
            "logical"
        } else {
            "notify"
        },
        relays: args.relays.max(1),
        scopes: args.scopes.max(8),
        subscribers: args.subscribers.max(2),
        writers: args.writers.max(1),
        fault_every: Duration::from_secs_f64(args.fault_every.max(0.5)),
        binary: args.relay_bin,
        work_dir: args.work_dir.join(format!(
            "{}-{}-{}",
            args.mode,
            args.seed,
            std::process::id()
        )),
    };
    match run(plan).await {
        Ok(report) => {
            for line in report.lines() {
                println!("{line}");
            }
            if !report.verdict.anomalies.is_empty() {
                std::process::exit(1);
            }
        }
        Err(error) => {
            eprintln!("the campaign could not run: {error}");
            std::process::exit(2);
        }
    }
}
