//! What every scenario is handed: the command line ([`Args`]), the sizes
//! of the run ([`Scale`]) and the bench's schema ([`Context`]); and the
//! shape of a [`Scenario`], so that the binary is a table of them.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::time::Duration;

use clap::Parser;

use crate::BenchResult;
use crate::proc_stats;
use crate::publish::Source;
use crate::relay_process::{RelayProcess, RelaySettings};
use crate::report::Table;
use crate::scenarios::fanout::Server;

#[derive(Parser, Debug)]
#[command(about = "eventrelay performance harness")]
pub struct Args {
    #[arg(long)]
    pub quick: bool,
    #[arg(long)]
    pub relay_bin: PathBuf,
    #[arg(long, env = "DATABASE_URL")]
    pub database_url: String,
    /// nchan's loopback address (`/pub` publishes, `/sub` subscribes).
    #[arg(long)]
    pub nchan_address: Option<SocketAddr>,
    /// nginx's master pid; CPU and RSS are summed over its workers.
    #[arg(long)]
    pub nchan_pid: Option<u32>,
    #[arg(long, default_value = "/tmp/eventrelay-bench")]
    pub work_dir: PathBuf,
    /// An earlier release `eventrelay`, for the publish rows side by side.
    #[arg(long)]
    pub baseline_relay_bin: Option<PathBuf>,
    /// A Postgres with `wal_level = logical`, for the wake-up modes.
    #[arg(long)]
    pub logical_database_url: Option<String>,
    /// Run only these scenarios (comma separated; box runs only when named).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    #[arg(long, default_value_t = 3)]
    pub floor_rounds: usize,
    /// Run nchan twice in every round of the floor scenario.
    #[arg(long)]
    pub floor_control: bool,
}

pub struct Scale {
    pub small_fanout: usize,
    pub large_fanout: usize,
    pub fixed_run: Duration,
    pub unthrottled_run: Duration,
    pub emit_run: Duration,
}

impl Scale {
    pub fn of(quick: bool) -> Scale {
        let (small_fanout, large_fanout, [fixed, unthrottled, emit]) = if quick {
            (200, 1_000, [3, 2, 1])
        } else {
            (1_000, 10_000, [10, 5, 3])
        };
        Scale {
            small_fanout,
            large_fanout,
            fixed_run: Duration::from_secs(fixed),
            unthrottled_run: Duration::from_secs(unthrottled),
            emit_run: Duration::from_secs(emit),
        }
    }
}

pub struct Context {
    pub args: Args,
    pub scale: Scale,
    pub schema: String,
}

impl Context {
    pub fn db(&self) -> &str {
        &self.args.database_url
    }

    pub fn settings(&self) -> RelaySettings {
        RelaySettings::new(self.db(), &self.schema)
    }

    pub async fn start_relay(&self, settings: RelaySettings) -> BenchResult<RelayProcess> {
        RelayProcess::start(&self.args.relay_bin, &self.args.work_dir, &settings).await
    }

    pub fn emit_source(&self) -> Source {
        Source::emit(self.db(), &self.schema)
    }

    pub fn nchan(&self) -> Option<(SocketAddr, Server)> {
        let (address, master) = (self.args.nchan_address?, self.args.nchan_pid?);
        let mut pids = proc_stats::children_of(master);
        pids.push(master);
        Some((address, Server::Nchan { address, pids }))
    }
}

pub type Rows<'a> = Pin<Box<dyn Future<Output = BenchResult<()>> + 'a>>;

#[derive(Clone, Copy)]
pub enum Run {
    /// Before any runtime or other thread exists: for figures read off the
    /// counting allocator, which must see no one else allocate.
    Alone(fn(&Context, &mut Table)),
    Async(for<'a> fn(&'a Context, &'a mut Table) -> Rows<'a>),
}

pub struct Scenario {
    pub name: &'static str,
    pub by_default: bool,
    pub run: Run,
}

impl Scenario {
    pub fn wanted(&self, cx: &Context) -> bool {
        if cx.args.only.is_empty() {
            self.by_default
        } else {
            cx.args.only.iter().any(|only| only == self.name)
        }
    }
}

#[macro_export]
macro_rules! rows {
    ($run:path) => {{
        fn boxed<'a>(
            cx: &'a $crate::context::Context,
            table: &'a mut $crate::report::Table,
        ) -> $crate::context::Rows<'a> {
            Box::pin($run(cx, table))
        }
        $crate::context::Run::Async(boxed)
    }};
}
