//! Many scopes (`--only scopes`): small scopes sharing one event rate, each
//! subscriber in one of them.

use crate::BenchResult;
use crate::context::Context;
use crate::publish::Pace;
use crate::report::{Table, verdict};
use crate::scenarios::fanout::{self, FanoutPlan, Server, fanout_summary};

/// Many small scopes at a shared rate.
pub async fn rows(cx: &Context, table: &mut Table) -> BenchResult<()> {
    let subscribers = cx.scale.scopes * cx.scale.per_scope;
    let relay = cx.start_relay(cx.settings()).await?;
    let rate = 200.0;
    eprintln!("many scopes: {} × {}", cx.scale.scopes, cx.scale.per_scope);
    let plan = FanoutPlan {
        subscribers,
        scopes: cx.scale.scopes,
        scope_prefix: "many".to_owned(),
        pace: Pace::PerSecond(rate),
        duration: cx.scale.fixed_run,
        writers: 4,
        source: cx.emit_source(),
    };
    let f = fanout::run(&plan, &Server::of(&relay)).await?;
    table.add(
        format!(
            "many scopes: {} scopes × {} subscribers, {rate:.0} ev/s spread over them, emit",
            cx.scale.scopes, cx.scale.per_scope
        ),
        fanout_summary(&f),
        format!("all received: {}", verdict(f.delivered == f.expected)),
    );
    Ok(())
}
