//! The operator console's files: served only with an admin token and
//! `http.console` on, under a policy that lets the page reach nothing but
//! this relay, and holding no address of anywhere else. What the page does
//! in a browser is tested by `clients/js/test/console.e2e.test.js`.

use crate::support::TestDb;
use crate::support::server::TestServer;
use serde_json::Value;

const ADMIN_TOKEN: &str = "admin-token-for-the-console";
const FILES: [(&str, &str); 3] = [
    ("/console", "text/html; charset=utf-8"),
    ("/console/console.js", "text/javascript; charset=utf-8"),
    ("/console/console.css", "text/css; charset=utf-8"),
];

/// Addresses the files may spell without loading them: the SVG namespace
/// and a form field's example.
const NOT_FETCHED: [&str; 2] = [
    "http://www.w3.org/2000/svg",
    "https://billing.example.com/hooks",
];

async fn get(server: &TestServer, path: &str) -> reqwest::Response {
    reqwest::get(server.url(path)).await.unwrap()
}

#[tokio::test]
async fn the_console_is_served_with_a_same_origin_policy_and_no_outside_address() {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, |c| c.admin.token = Some(ADMIN_TOKEN.into()));
    server.ready().await;
    for (path, content_type) in FILES {
        let response = get(&server, path).await;
        assert_eq!(response.status(), 200, "{path}");
        let headers = response.headers().clone();
        assert_eq!(headers["content-type"], content_type, "{path}");
        assert_eq!(headers["x-content-type-options"], "nosniff");
        let policy = headers["content-security-policy"].to_str().unwrap();
        for directive in [
            "default-src 'none'",
            "script-src 'self'",
            "connect-src 'self'",
            "frame-ancestors 'none'",
        ] {
            assert!(policy.contains(directive), "{path}: {policy}");
        }
        assert!(!policy.contains("unsafe-inline"), "{policy}");
        let body = response.text().await.unwrap();
        assert!(body.len() > 500, "{path} is nearly empty");
        let addresses: Vec<&str> = body
            .match_indices("http")
            .map(|(at, _)| &body[at..])
            .filter(|rest| rest.starts_with("http://") || rest.starts_with("https://"))
            .map(|rest| rest.split(['"', '\'', ' ', ')', '`']).next().unwrap())
            .collect();
        for address in addresses {
            assert!(
                NOT_FETCHED.contains(&address),
                "{path} names {address}, which the page could load"
            );
        }
        assert!(!body.contains("@import"), "{path}");
    }
    let page = get(&server, "/console").await.text().await.unwrap();
    assert!(page.contains(r#"src="/console/console.js""#), "{page}");
    assert!(page.contains(r#"href="/console/console.css""#), "{page}");
    assert!(!page.contains("<script>"), "no inline script");
    assert!(!page.contains("style=\""), "no inline style");
}

#[tokio::test]
async fn without_an_admin_token_or_with_the_console_off_there_is_no_console() {
    let db = TestDb::new().await;
    let no_token = TestServer::start(&db, |_| {});
    let off = TestServer::start(&db, |c| {
        c.admin.token = Some(ADMIN_TOKEN.into());
        c.http.console = false;
    });
    for server in [&no_token, &off] {
        server.ready().await;
        for (path, _) in FILES {
            let response = get(server, path).await;
            assert_eq!(response.status(), 404, "{path}");
            let body: Value = response.json().await.unwrap();
            assert_eq!(body["error"]["code"], "not_found", "{path}");
        }
    }
}
