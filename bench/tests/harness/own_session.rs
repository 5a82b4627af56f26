//! A relay the side-by-side scenarios start runs in a session of its own
//! (as nginx, which daemonizes, does), so the kernel's autogroup
//! scheduling does not count it with the load tool.

use eventrelay_bench::database::{create_schema, drop_schema, test_database_url, unique_schema};
use eventrelay_bench::relay_process::{RelayProcess, RelaySettings};

use crate::relay_binary;

fn session_of(pid: u32) -> i32 {
    // SAFETY: getsid only reads the kernel's record of a process.
    unsafe { libc::getsid(pid as i32) }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_started_in_its_own_session_leads_it_and_one_started_plainly_shares_ours() {
    let url = test_database_url();
    let schema = unique_schema("bench_session");
    create_schema(&url, &schema).await.expect("schema migrates");
    let work_dir = std::env::temp_dir().join(&schema);
    std::fs::create_dir_all(&work_dir).unwrap();
    let ours = session_of(std::process::id());

    let apart = RelayProcess::start(
        &relay_binary(),
        &work_dir,
        &RelaySettings::new(&url, &schema).in_own_session(),
    )
    .await;
    let plain = RelayProcess::start(
        &relay_binary(),
        &work_dir,
        &RelaySettings::new(&url, &schema),
    )
    .await;
    let sessions = match (&apart, &plain) {
        (Ok(apart), Ok(plain)) => Some((
            apart.pid(),
            session_of(apart.pid()),
            session_of(plain.pid()),
        )),
        _ => None,
    };
    drop((apart, plain));
    drop_schema(&url, &schema).await;
    let (apart_pid, apart_session, plain_session) = sessions.expect("both relays start");
    assert_eq!(
        apart_session, apart_pid as i32,
        "the relay leads a session of its own"
    );
    assert_ne!(apart_session, ours);
    assert_eq!(plain_session, ours, "without it, the relay stays in ours");
}
