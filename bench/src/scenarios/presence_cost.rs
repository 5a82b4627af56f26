//! Presence (`--only presence`): 10,000 members of a scope, 100 joining and
//! 100 leaving a second, simulated: the bench writes a third relay's rows and
//! heartbeat, 10 joins and 10 leaves every 100 ms, while two real relays read,
//! merge and send them to 20 streams each. Per change, each relay's CPU and
//! Postgres's (`pg_stat_activity`); per stream, bytes, frames, last count.

use std::time::{Duration, Instant};

use crate::{BenchResult, context::Context, proc_stats::usage, report::Table, subscriber_token};

const STREAMS: usize = 40;
const ROW: &str = "presence: 10,000 members written to the table by a simulated third relay, \
    100 joins + 100 leaves a second; 2 relays × 20 streams; `max_members`";

pub async fn rows(cx: &Context, table: &mut Table) -> BenchResult<()> {
    for cap in [1_000, 20_000] {
        table.note(format!("{ROW} {cap}"), run(cx, cap).await?);
    }
    Ok(())
}

async fn run(cx: &Context, cap: usize) -> BenchResult<String> {
    let (s, db) = (&cx.schema, eventrelay::connect(cx.db()).await?);
    // The simulated relay's members `m<i + d>` with `n` streams; a heartbeat every 10 s.
    let write = |a: usize, b: usize, dn: &str| {
        format!(
            "INSERT INTO {s}.presence_members (relay_id, scope_key, subscriber_id, streams)
             SELECT 'sim', 'presence', 'm' || (i + d), n FROM generate_series({a}, {b}) i,
             (VALUES {dn}) v(d, n) ON CONFLICT (scope_key, subscriber_id, relay_id) DO UPDATE
             SET streams = excluded.streams, version = nextval('{s}.presence_version'),
             changed_at = now(); INSERT INTO {s}.presence_relays SELECT 'sim', now()
             WHERE {a} % 1000 = 1 ON CONFLICT (relay_id) DO UPDATE SET heartbeat_at = now()"
        )
    };
    let clear = format!("TRUNCATE {s}.presence_members, {s}.presence_relays;");
    db.batch_execute(&(clear + &write(1, 10_000, "(0, 1)")))
        .await?;
    let mut settings = cx.settings();
    settings.extra_toml = format!("[presence]\nscopes = [\"presence\"]\nmax_members = {cap}\n");
    let relays = [cx.start_relay(settings.clone()), cx.start_relay(settings)];
    let relays = futures_util::future::try_join_all(relays).await?;
    let (t0, mut streams) = (Instant::now() + Duration::from_secs(3), Vec::new());
    for n in 0..STREAMS {
        let token = subscriber_token(&format!("p{n}"), "presence", serde_json::Value::Null);
        let url = format!("{}/v1/events", relays[n % 2].base);
        let request = reqwest::Client::new().get(url).bearer_auth(token);
        let mut response = request.send().await?;
        streams.push(tokio::spawn(async move {
            let (mut body, mut start) = (Vec::new(), 0);
            while let Ok(Some(chunk)) = response.chunk().await {
                start += if Instant::now() < t0 { chunk.len() } else { 0 };
                body.extend_from_slice(&chunk);
            }
            (String::from_utf8_lossy(&body).into_owned(), start)
        }));
    }
    let sql = "SELECT array_agg(pid::oid) FROM pg_stat_activity";
    let mut pids: Vec<u32> = relays.iter().map(|relay| relay.pid()).collect();
    pids.extend(db.query_one(sql, &[]).await?.get::<_, Vec<u32>>(0));
    // Per process, so that one which ends meanwhile counts nothing.
    let cpu = || pids.iter().map(|pid| usage(&[*pid]).cpu_seconds);
    let secs = if cx.args.quick { 5 } else { 30 };
    let mut ticks = tokio::time::interval_at(t0.into(), Duration::from_millis(100));
    ticks.tick().await;
    let mut spent: Vec<f64> = cpu().collect();
    for a in (1..secs * 100).step_by(10) {
        let churn = write(a, a + 9, "(0, 0), (10000, 1)");
        db.batch_execute(&churn).await?;
        ticks.tick().await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    for (spent, now) in spent.iter_mut().zip(cpu()) {
        *spent = (now - *spent).max(0.0) * 1e6 / (200 * secs) as f64;
    }
    drop(relays);
    let (mut bytes, mut frames, mut counted, per) = (0.0, 0.0, 0, (STREAMS * secs) as f64);
    for stream in streams {
        let (text, start) = stream.await?;
        let window = text.get(start..).unwrap_or_default();
        bytes += window.len() as f64 / per;
        frames += window.matches("event: presence").count() as f64 / per;
        let last = text.rsplit("\"count\":").next().unwrap_or_default();
        counted += usize::from(last.starts_with(&format!("{},", 10_000 + STREAMS)));
    }
    let (a, b, pg) = (spent[0], spent[1], spent[2..].iter().sum::<f64>());
    Ok(format!(
        "CPU per change: relays {a:.0} and {b:.0} µs, Postgres {pg:.0} µs · per stream {bytes:.0} \
         B/s, {frames:.1} frames/s · {counted} of {STREAMS} streams end on the right count"
    ))
}
