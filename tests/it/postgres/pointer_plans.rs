//! Two planners group a statement's rows into carrying pointers: the outbox
//! trigger in SQL, for emitters, and `assign_to_pointers` in Rust, for
//! writers that announce their own rows. On generated statements, measured
//! alike (each row's envelope as the trigger prints it), both put the same
//! rows together, and both give up on the same rows too large to travel.

use std::collections::BTreeSet;

use crate::support::TestDb;
use eventrelay::wire::assign_to_pointers;
use serde_json::Value;

/// Scope keys of several JSON lengths, one of them with a non-ASCII letter.
const SCOPES: [&str; 4] = ["a", "org-1", "org-é", "workspace:7/team:12"];

/// The rows of one pointer, as the seqs it carries; a bare pointer names
/// its seq only.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Planned {
    Carrying(String, Vec<i64>),
    Bare(String, i64),
}

fn planned(payload: &str) -> Planned {
    let pointer: Value = serde_json::from_str(payload).expect("a pointer is JSON");
    assert_eq!(pointer["k"], "ptr", "{payload}");
    let scope = pointer["s"].as_str().unwrap().to_owned();
    match pointer.get("r") {
        Some(rows) => Planned::Carrying(
            scope,
            rows.as_array()
                .unwrap()
                .iter()
                .map(|row| row["seq"].as_i64().unwrap())
                .collect(),
        ),
        None => Planned::Bare(scope, pointer["q"].as_i64().unwrap()),
    }
}

#[tokio::test]
async fn the_trigger_and_the_rust_planner_group_rows_alike() {
    let db = TestDb::new().await;
    let mut listener = db.listen().await;
    let client = db.connect().await;
    let mut rng = fastrand::Rng::with_seed(20261206);
    let (mut carrying_cases, mut bare_cases) = (0, 0);
    for case in 0..40 {
        // Mostly rows that fill a pointer in a few, now and then one too
        // large for any.
        let rows = rng.usize(1..=40);
        let scopes: Vec<&str> = (0..rows)
            .map(|_| SCOPES[rng.usize(..SCOPES.len())])
            .collect();
        let sizes: Vec<i32> = (0..rows)
            .map(|_| match rng.u8(..100) {
                0..=2 if case % 4 == 3 => 8_500,
                0..=29 => rng.i32(1_500..3_500),
                _ => rng.i32(0..400),
            })
            .collect();
        let inserted = client
            .query(
                &format!(
                    "SELECT seq FROM {schema}.emit_batch(
                         array_fill(NULL::uuid, ARRAY[$3::int]),
                         array_fill('t.planned'::text, ARRAY[$3::int]),
                         $1::text[],
                         ARRAY(SELECT jsonb_build_object('pad', repeat('x', s)) FROM unnest($2::int[]) s),
                         array_fill(NULL::jsonb, ARRAY[$3::int]),
                         array_fill('[]'::jsonb, ARRAY[$3::int]),
                         array_fill(NULL::timestamptz, ARRAY[$3::int]))",
                    schema = db.schema
                ),
                &[&scopes, &sizes, &(rows as i32)],
            )
            .await
            .unwrap();
        let first: i64 = inserted[0].get(0);
        let sent: BTreeSet<Planned> = listener
            .drain(&db)
            .await
            .iter()
            .map(|payload| planned(payload))
            .collect();

        // The same rows, measured as the trigger measures them.
        let measured = client
            .query(
                &format!(
                    "SELECT o.seq, o.scope_key, octet_length({schema}.outbox_envelope(o))::int8
                     FROM {schema}.outbox o WHERE o.seq >= $1 ORDER BY o.seq",
                    schema = db.schema
                ),
                &[&first],
            )
            .await
            .unwrap();
        let rows: Vec<(i64, String, i64)> = measured
            .iter()
            .map(|row| (row.get(0), row.get(1), row.get(2)))
            .collect();
        let plan = assign_to_pointers(
            rows.iter()
                .map(|(_, scope, len)| (scope.as_str(), *len as usize)),
        );
        match plan {
            Some(numbers) => {
                carrying_cases += 1;
                let mut groups: Vec<(String, Vec<i64>)> = Vec::new();
                for ((seq, scope, _), number) in rows.iter().zip(numbers) {
                    let number = number as usize;
                    if groups.len() <= number {
                        groups.push((scope.clone(), Vec::new()));
                    }
                    assert_eq!(groups[number].0, *scope, "a pointer holds one scope");
                    groups[number].1.push(*seq);
                }
                let rust: BTreeSet<Planned> = groups
                    .into_iter()
                    .map(|(scope, seqs)| Planned::Carrying(scope, seqs))
                    .collect();
                assert_eq!(rust, sent, "case {case}: {rows:?}");
            }
            None => {
                bare_cases += 1;
                assert!(
                    sent.iter().any(|p| matches!(p, Planned::Bare(..))),
                    "case {case}: the Rust planner gave up, so some row cannot travel, and the trigger sent it bare: {sent:?}"
                );
            }
        }
    }
    // Both kinds of statement were tried.
    assert!(
        carrying_cases > 0 && bare_cases > 0,
        "{carrying_cases} / {bare_cases}"
    );
}
